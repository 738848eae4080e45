// efccl.torch._backend: the pybind11 module behind efccl.torch (python/efccl/torch/__init__.py).
// It is built with torch's own pybind11 headers and ABI settings, so its classes derive from
// the c10d types torch registered (Backend, Backend.Options) and torch's ProcessGroup holds
// ProcessGroupEfccl like any backend.
#include <pybind11/chrono.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <optional>
#include <string>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

#include "efccl_library.h"
#include "environment_override.h"
#include "group_state.h"
#include "process_group_efccl.h"

namespace py = pybind11;
using efccl::torch_backend::EfcclOptions;
using efccl::torch_backend::ProcessGroupEfccl;

PYBIND11_MODULE(_backend, m) {
  m.doc() = "efccl's torch.distributed backend (use efccl.torch)";

  m.def(
      "load_library",
      [](const std::string& path) {
        const auto& lib = efccl::torch_backend::load_efccl_library(path);
        efccl::torch_backend::prepare_environment_overrides();
        if (lib.SetSelectionCallback != nullptr)
          (void)lib.SetSelectionCallback(&efccl::torch_backend::on_selection, nullptr);
        return py::make_tuple(lib.path, lib.version, lib.SetSelectionCallback != nullptr);
      },
      py::arg("path"),
      "Loads libefccl.so from `path` privately (RTLD_LOCAL); returns (path, version, whether it "
      "reports program selections). Raises RuntimeError naming what is wrong.");

  py::class_<EfcclOptions, c10d::Backend::Options, c10::intrusive_ptr<EfcclOptions>>(
      m, "Options", "Options of an efccl process group (pass as pg_options)")
      .def(py::init([](std::vector<std::string> algorithm_files, bool blocking_wait,
                       bool high_priority_stream) {
             auto o = c10::make_intrusive<EfcclOptions>();
             o->algorithm_files = std::move(algorithm_files);
             o->blocking_wait = blocking_wait;
             o->high_priority_stream = high_priority_stream;
             return o;
           }),
           py::arg("algorithm_files") = std::vector<std::string>{},
           py::arg("blocking_wait") = false, py::arg("high_priority_stream") = false)
      .def_readwrite("algorithm_files", &EfcclOptions::algorithm_files)
      .def_readwrite("blocking_wait", &EfcclOptions::blocking_wait)
      .def_readwrite("high_priority_stream", &EfcclOptions::high_priority_stream)
      .def_property(
          "timeout_ms", [](const EfcclOptions& o) { return o.timeout.count(); },
          [](EfcclOptions& o, int64_t ms) { o.timeout = std::chrono::milliseconds(ms); })
      .def("__copy__", [](const EfcclOptions& o) { return o.copy(); })
      .def("__deepcopy__", [](const EfcclOptions& o, py::dict) { return o.copy(); });

  py::class_<ProcessGroupEfccl, c10d::Backend, c10::intrusive_ptr<ProcessGroupEfccl>>(
      m, "ProcessGroupEfccl", "torch.distributed backend 'efccl'")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       std::vector<int64_t> global_ranks, std::string group_name,
                       const c10::intrusive_ptr<EfcclOptions>& options,
                       const std::optional<c10::intrusive_ptr<ProcessGroupEfccl>>& split_from) {
             // Without the GIL only while the C++ object is built (a split waits there for the
             // other ranks). Not as a call_guard of __init__: pybind11 would then also register
             // the new Python instance in its tables without the GIL.
             c10::intrusive_ptr<ProcessGroupEfccl> group;
             {
               py::gil_scoped_release no_gil;
               group = c10::make_intrusive<ProcessGroupEfccl>(
                   store, rank, size, std::move(global_ranks), std::move(group_name), options,
                   split_from.value_or(c10::intrusive_ptr<ProcessGroupEfccl>()));
             }
             return group;
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("global_ranks"),
           py::arg("group_name"), py::arg("options"), py::arg("split_from") = py::none())
      .def("perform_nocolor_split", &ProcessGroupEfccl::performNocolorSplit, py::arg("device"),
           py::call_guard<py::gil_scoped_release>())
      .def("comm_split_count", &ProcessGroupEfccl::commSplitCount)
      .def_property_readonly("options", &ProcessGroupEfccl::options_copy)
      .def("_is_initialized", &ProcessGroupEfccl::isInitialized)
      .def("_stats_json", &ProcessGroupEfccl::stats_json)
      .def("_failure", [](const ProcessGroupEfccl& pg) { return pg.state()->failure(); })
      .def("abort", &ProcessGroupEfccl::abort, py::call_guard<py::gil_scoped_release>())
      .def("shutdown", &ProcessGroupEfccl::shutdown, py::call_guard<py::gil_scoped_release>())
      .def("_shutdown", &ProcessGroupEfccl::shutdown, py::call_guard<py::gil_scoped_release>());
}
