// efccl._efccl: the C++ core seen from Python. The chunk API (ProgramBuilder, Ref, Buffer),
// compiled Programs and their JSON / MSCCL XML forms, validation, the host reference executor
// and the built-in algorithm library. The MSCCLang-compatible front end (efccl.language) is
// pure Python on top of this module.
//
// Errors: the C++ core reports them as a Status; here every failed Status becomes an
// efccl.Error (a RuntimeError) carrying the C++ message unchanged.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "efccl/algorithms/algorithm_library.h"
#include "efccl/compiler/program_builder.h"
#include "efccl/ef/datatype.h"
#include "efccl/ef/json_io.h"
#include "efccl/ef/load.h"
#include "efccl/ef/msccl_xml.h"
#include "efccl/ef/program.h"
#include "efccl/ef/validate.h"
#include "efccl/host/executor.h"

namespace py = pybind11;

namespace efccl::python {
namespace {

/// The Python exception for every failed Status (registered as efccl._efccl.Error).
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] void raise(const std::string& message) { throw Error(message); }

void check(const Status& s) {
  if (!s) raise(s.message());
}

template <typename T>
T value_or_raise(StatusOr<T> s) {
  if (!s) raise(s.status().message());
  return std::move(*s);
}

ef::Collective parse_collective(const std::string& s) {
  // MSCCLang spells reducescatter "reduce_scatter"; accept both.
  const std::string name = s == "reduce_scatter" ? "reducescatter" : s;
  auto c = ef::parse_collective(name);
  if (!c) raise("unknown collective '" + s + "'");
  return *c;
}

ef::Protocol parse_protocol(const std::string& s) {
  auto p = ef::parse_protocol(s);
  if (!p) raise("unknown protocol '" + s + "' (expected Simple, LL or LL128)");
  return *p;
}

std::string join(const Diagnostics& diags) {
  std::string out;
  for (const auto& d : diags) {
    if (!out.empty()) out += '\n';
    out += d.to_string();
  }
  return out;
}

ef::Program load_result_or_raise(ef::LoadResult r) {
  if (!r.program) raise(join(r.diagnostics));
  return std::move(*r.program);
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string to_msccl_xml(const ef::Program& p) { return value_or_raise(ef::save_msccl_xml(p)); }

/// Writes the program to `path`: MSCCL XML when the name ends in .xml, EF JSON otherwise.
void save_program(const ef::Program& p, const std::string& path) {
  const std::string text = ends_with(path, ".xml") ? to_msccl_xml(p) : ef::save_json(p);
  std::ofstream out(path, std::ios::binary);
  if (!out) raise("cannot write '" + path + "'");
  out << text;
  if (!out) raise("error writing '" + path + "'");
}

/// The compiler's switches as keyword arguments (names of compiler::CompileOptions).
compiler::CompileOptions make_options(const py::kwargs& kw) {
  compiler::CompileOptions o;
  for (auto item : kw) {
    const auto key = py::cast<std::string>(item.first);
    const py::handle v = item.second;
    if (key == "fuse_rcs")
      o.fuse_rcs = py::cast<bool>(v);
    else if (key == "fuse_rrcs")
      o.fuse_rrcs = py::cast<bool>(v);
    else if (key == "fuse_rrs")
      o.fuse_rrs = py::cast<bool>(v);
    else if (key == "dependence_nop")
      o.dependence_nop = py::cast<bool>(v);
    else if (key == "interleaved_replication")
      o.interleaved_replication = py::cast<bool>(v);
    else if (key == "detect_inplace")
      o.detect_inplace = py::cast<bool>(v);
    else if (key == "gc3_priority")
      o.gc3_priority = py::cast<bool>(v);
    else if (key == "validate")
      o.validate = py::cast<bool>(v);
    else if (key == "root")
      o.root = py::cast<int32_t>(v);
    else if (key == "min_bytes")
      o.min_bytes = py::cast<uint64_t>(v);
    else if (key == "max_bytes") {
      if (!v.is_none()) o.max_bytes = py::cast<uint64_t>(v);
    } else {
      throw py::type_error("unknown compile option '" + key + "'");
    }
  }
  return o;
}

/// Owns a ProgramBuilder for Python (every PyRef holds a reference to its PyBuilder).
class PyBuilder {
 public:
  PyBuilder(const std::string& name, const std::string& collective, int32_t nranks,
            int64_t chunk_factor, bool inplace, const std::string& protocol, int32_t instances,
            const py::kwargs& kw)
      : b_(name, parse_collective(collective), nranks, chunk_factor, inplace,
           parse_protocol(protocol), instances, make_options(kw)) {
    check(b_.status());
  }

  compiler::ProgramBuilder& get() { return b_; }

  /// Raises the builder's first error, if any (every trace call ends with this).
  void check_status() const { check(b_.status()); }

 private:
  compiler::ProgramBuilder b_;
};

/// A compiler::Ref plus the Python object of its builder, which it keeps alive (a Ref points
/// at its builder) and whose first error it raises when an operation fails.
struct PyRef {
  compiler::Ref ref;
  py::object owner;  ///< the PyBuilder

  PyBuilder& builder() const { return owner.cast<PyBuilder&>(); }
  PyRef wrap(compiler::Ref r) const {
    builder().check_status();
    if (!r.valid()) raise("invalid reference");
    return PyRef{r, owner};
  }
};

std::string buffer_repr(const compiler::Buffer& b) {
  std::string s = std::string(ef::to_string(b.kind));
  if (b.scratch_id >= 0) s += "#" + std::to_string(b.scratch_id);
  return s;
}

py::dict algorithm_info(const algorithms::AlgorithmInfo& a) {
  py::dict d;
  d["name"] = a.name;
  d["collective"] = std::string(ef::to_string(a.collective));
  d["description"] = a.description;
  d["default_min_bytes"] = a.default_min_bytes;
  d["default_max_bytes"] = a.default_max_bytes ? py::cast(*a.default_max_bytes) : py::none();
  return d;
}

}  // namespace
}  // namespace efccl::python

PYBIND11_MODULE(_efccl, m) {
  using namespace efccl;
  using namespace efccl::python;
  m.doc() = "efccl's C++ core: chunk compiler, EF programs, validation, host executor";

  py::register_exception<Error>(m, "Error", PyExc_RuntimeError);

  // ---- Buffer ----
  py::class_<compiler::Buffer>(m, "Buffer",
                               "One buffer of every rank (input, output, scratch, named scratch)")
      .def_property_readonly(
          "kind", [](const compiler::Buffer& b) { return std::string(ef::to_string(b.kind)); })
      .def_readonly("scratch_id", &compiler::Buffer::scratch_id)
      .def_property_readonly_static("input", [](py::object) { return compiler::kInput; })
      .def_property_readonly_static("output", [](py::object) { return compiler::kOutput; })
      .def_property_readonly_static("scratch", [](py::object) { return compiler::kScratch; })
      .def("__eq__", [](const compiler::Buffer& a, const compiler::Buffer& b) { return a == b; })
      .def("__hash__",
           [](const compiler::Buffer& b) {
             return static_cast<int64_t>(b.kind) * 1000003 + b.scratch_id;
           })
      .def("__repr__", [](const compiler::Buffer& b) { return "Buffer(" + buffer_repr(b) + ")"; });

  // ---- Ref ----
  py::class_<PyRef>(m, "Ref", "A reference to consecutive chunks of one buffer of one rank")
      .def_property_readonly("rank", [](const PyRef& r) { return r.ref.rank(); })
      .def_property_readonly("buffer", [](const PyRef& r) { return r.ref.buffer(); })
      .def_property_readonly("index", [](const PyRef& r) { return r.ref.index(); })
      .def_property_readonly("size", [](const PyRef& r) { return r.ref.size(); })
      .def(
          "copy",
          [](const PyRef& r, int32_t dst, compiler::Buffer buffer, int64_t index, int sendtb,
             int recvtb,
             int ch) { return r.wrap(r.ref.copy(dst, buffer, index, sendtb, recvtb, ch)); },
          py::arg("dst"), py::arg("buffer"), py::arg("index"), py::arg("sendtb") = -1,
          py::arg("recvtb") = -1, py::arg("ch") = -1,
          "Copies these chunks to (dst, buffer, index); returns a reference to the copy")
      .def(
          "reduce",
          [](const PyRef& r, const PyRef& other, int sendtb, int recvtb, int ch) {
            return r.wrap(r.ref.reduce(other.ref, sendtb, recvtb, ch));
          },
          py::arg("other"), py::arg("sendtb") = -1, py::arg("recvtb") = -1, py::arg("ch") = -1,
          "Stores (other (op) this) here; returns a reference to it")
      .def(
          "reduce_into",
          [](const PyRef& r, const PyRef& other, compiler::Buffer buffer, int64_t index, int sendtb,
             int recvtb, int ch) {
            return r.wrap(r.ref.reduce_into(other.ref, buffer, index, sendtb, recvtb, ch));
          },
          py::arg("other"), py::arg("buffer"), py::arg("index"), py::arg("sendtb") = -1,
          py::arg("recvtb") = -1, py::arg("ch") = -1,
          "Stores (other (op) this) at (this rank, buffer, index), leaving this unchanged")
      .def("__repr__", [](const PyRef& r) {
        return "Ref(rank=" + std::to_string(r.ref.rank()) +
               ", buffer=" + buffer_repr(r.ref.buffer()) +
               ", index=" + std::to_string(r.ref.index()) +
               ", size=" + std::to_string(r.ref.size()) + ")";
      });

  // ---- ProgramBuilder ----
  py::class_<PyBuilder>(m, "ProgramBuilder",
                        "Records a trace of chunk operations and compiles it (GC3 §5)")
      .def(py::init<const std::string&, const std::string&, int32_t, int64_t, bool,
                    const std::string&, int32_t, const py::kwargs&>(),
           py::arg("name"), py::arg("collective"), py::arg("nranks"), py::arg("chunk_factor"),
           py::arg("inplace") = false, py::arg("protocol") = "Simple", py::arg("instances") = 1)
      .def(
          "set_buffer_sizes",
          [](PyBuilder& b, int32_t rank, int64_t in, int64_t out) {
            b.get().set_buffer_sizes(rank, in, out);
            b.check_status();
          },
          py::arg("rank"), py::arg("input_chunks"), py::arg("output_chunks"))
      .def(
          "set_postconditions",
          [](PyBuilder& b,
             const std::vector<
                 std::tuple<int32_t, int64_t, std::vector<std::pair<int32_t, int64_t>>>>& posts) {
            std::vector<ef::Postcondition> out;
            for (const auto& [rank, index, sources] : posts) {
              ef::Postcondition p{rank, index, {}};
              for (const auto& [r, i] : sources) p.sources.push_back({r, i});
              out.push_back(std::move(p));
            }
            b.get().set_postconditions(std::move(out));
            b.check_status();
          },
          py::arg("postconditions"), "[(rank, output_index, [(src_rank, input_index), ...]), ...]")
      .def(
          "scratch_buffer",
          [](PyBuilder& b, const std::string& name) { return b.get().scratch_buffer(name); },
          py::arg("name"))
      .def(
          "chunk",
          [](py::object self, int32_t rank, compiler::Buffer buffer, int64_t index, int64_t size) {
            PyBuilder& b = self.cast<PyBuilder&>();
            return PyRef{compiler::Ref(), self}.wrap(b.get().chunk(rank, buffer, index, size));
          },
          py::arg("rank"), py::arg("buffer"), py::arg("index"), py::arg("size") = 1,
          "A reference to chunks index .. index+size-1 of buffer on rank")
      .def_property_readonly("status",
                             [](PyBuilder& b) -> std::optional<std::string> {
                               const Status& s = b.get().status();
                               if (s) return std::nullopt;
                               return s.message();
                             })
      .def_property_readonly("nranks", [](PyBuilder& b) { return b.get().nranks(); })
      .def_property_readonly("chunk_factor", [](PyBuilder& b) { return b.get().chunk_factor(); })
      .def_property_readonly("trace_length", [](PyBuilder& b) { return b.get().trace().size(); })
      .def("compile", [](PyBuilder& b) { return value_or_raise(b.get().compile()); });

  // ---- Program ----
  py::class_<ef::Program>(m, "Program", "An EF program (docs/ef-format.md)")
      .def_readonly("name", &ef::Program::name)
      .def_property_readonly(
          "collective",
          [](const ef::Program& p) { return std::string(ef::to_string(p.collective)); })
      .def_property_readonly(
          "protocol", [](const ef::Program& p) { return std::string(ef::to_string(p.protocol)); })
      .def_readonly("nranks", &ef::Program::nranks)
      .def_readonly("nchunksperloop", &ef::Program::nchunksperloop)
      .def_readonly("nchannels", &ef::Program::nchannels)
      .def_readonly("root", &ef::Program::root)
      .def_readonly("inplace", &ef::Program::inplace)
      .def_readonly("outofplace", &ef::Program::outofplace)
      .def_readonly("min_bytes", &ef::Program::min_bytes)
      .def_readonly("max_bytes", &ef::Program::max_bytes)
      .def_property_readonly("count_granularity", &ef::count_granularity)
      .def_property_readonly("postconditions",
                             [](const ef::Program& p) {
                               py::list out;
                               for (const auto& c : p.postconditions) {
                                 py::list src;
                                 for (const auto& s : c.sources)
                                   src.append(py::make_tuple(s.rank, s.index));
                                 out.append(py::make_tuple(c.rank, c.index, src));
                               }
                               return out;
                             })
      .def(
          "buffer_chunks",
          [](const ef::Program& p, int32_t rank) {
            if (rank < 0 || rank >= static_cast<int32_t>(p.ranks.size()))
              throw py::index_error("rank");
            const auto& r = p.ranks[static_cast<std::size_t>(rank)];
            return py::make_tuple(r.input_chunks, r.output_chunks, r.scratch_chunks);
          },
          py::arg("rank"), "(input_chunks, output_chunks, scratch_chunks) of a rank")
      .def(
          "threadblocks",
          [](const ef::Program& p, int32_t rank) {
            if (rank < 0 || rank >= static_cast<int32_t>(p.ranks.size()))
              throw py::index_error("rank");
            py::list out;
            for (const auto& tb : p.ranks[static_cast<std::size_t>(rank)].threadblocks) {
              py::list ops;
              for (const auto& op : tb.ops) ops.append(std::string(ef::to_string(op.code)));
              py::dict d;
              d["send"] = tb.send_peer;
              d["recv"] = tb.recv_peer;
              d["channel"] = tb.channel;
              d["ops"] = ops;
              out.append(d);
            }
            return out;
          },
          py::arg("rank"), "[{send, recv, channel, ops: [op names]}] of a rank")
      .def(
          "op_counts",
          [](const ef::Program& p) {
            py::dict d;
            for (const auto& r : p.ranks)
              for (const auto& tb : r.threadblocks)
                for (const auto& op : tb.ops) {
                  const std::string k(ef::to_string(op.code));
                  d[k.c_str()] = (d.contains(k) ? py::cast<int64_t>(d[k.c_str()]) : 0) + 1;
                }
            return d;
          },
          "how many ops of each kind the whole program has")
      .def("to_json", &ef::save_json, "canonical EF JSON")
      .def("to_msccl_xml", &to_msccl_xml, "MSCCL XML (custom collectives cannot be exported)")
      .def("save", &save_program, py::arg("path"), "MSCCL XML when path ends in .xml, else EF JSON")
      .def("__eq__", [](const ef::Program& a, const ef::Program& b) { return a == b; })
      .def("__repr__", [](const ef::Program& p) {
        return "Program(name='" + p.name +
               "', collective=" + std::string(ef::to_string(p.collective)) +
               ", nranks=" + std::to_string(p.nranks) +
               ", nchunksperloop=" + std::to_string(p.nchunksperloop) +
               ", nchannels=" + std::to_string(p.nchannels) + ")";
      });

  // ---- Functions ----
  m.def(
      "compile", [](PyBuilder& b) { return value_or_raise(b.get().compile()); }, py::arg("builder"),
      "Compiles a ProgramBuilder's trace into a Program");
  m.def(
      "validate",
      [](const ef::Program& p, int slots) {
        ef::ValidateOptions o;
        o.connection_slots = slots;
        std::vector<std::string> out;
        for (const auto& d : ef::validate(p, o)) out.push_back(d.to_string());
        return out;
      },
      py::arg("program"), py::arg("connection_slots") = ef::kDefaultConnectionSlots,
      "All validation diagnostics as strings (empty when valid)");
  m.def(
      "run_host",
      [](const ef::Program& p, std::optional<uint64_t> count, const std::string& dtype,
         const std::string& op, std::optional<bool> inplace, uint64_t seed, std::size_t slot_bytes,
         int slots) {
        auto t = ef::parse_data_type(dtype);
        if (!t) raise("unknown datatype '" + dtype + "'");
        auto o = ef::parse_red_op(op);
        if (!o) raise("unknown reduction '" + op + "'");
        host::ExecOptions e;
        // Three elements per chunk by default, as `efccl run-host` does.
        e.count = count ? *count : ef::count_granularity(p) * 3;
        e.dtype = *t;
        e.op = *o;
        e.inplace = inplace ? *inplace : !p.outofplace;  // out-of-place when allowed
        e.slot_bytes = slot_bytes;
        e.connection_slots = slots;
        host::VerifyResult r;
        {
          py::gil_scoped_release release;
          r = host::run_and_verify(p, e, seed);
        }
        return py::make_tuple(r.pass, r.message);
      },
      py::arg("program"), py::arg("count") = py::none(), py::arg("dtype") = "float",
      py::arg("op") = "sum", py::arg("inplace") = py::none(), py::arg("seed") = 1,
      py::arg("slot_bytes") = 0, py::arg("connection_slots") = ef::kDefaultConnectionSlots,
      "Runs the program on the host reference executor with random inputs and checks the "
      "result: (passed, message)");
  m.def(
      "list_algorithms",
      [] {
        py::list out;
        for (const auto& a : algorithms::list_algorithms()) out.append(algorithm_info(a));
        return out;
      },
      "The built-in algorithms: [{name, collective, description, default_min_bytes, "
      "default_max_bytes}]");
  m.def(
      "generate_algorithm",
      [](const std::string& name, int32_t ranks, int32_t nodes, int32_t gpus_per_node,
         int32_t instances, int32_t channels, int32_t root, const std::string& protocol,
         bool inplace, std::optional<uint64_t> min_bytes, std::optional<uint64_t> max_bytes) {
        algorithms::AlgorithmParams a;
        a.ranks = ranks;
        a.nodes = nodes;
        a.gpus_per_node = gpus_per_node;
        a.instances = instances;
        a.channels = channels;
        a.root = root;
        a.protocol = parse_protocol(protocol);
        a.inplace = inplace;
        a.min_bytes = min_bytes;
        a.max_bytes = max_bytes;
        return value_or_raise(algorithms::generate_algorithm(name, a));
      },
      py::arg("name"), py::arg("ranks"), py::arg("nodes") = 1, py::arg("gpus_per_node") = 0,
      py::arg("instances") = 1, py::arg("channels") = 1, py::arg("root") = 0,
      py::arg("protocol") = "Simple", py::arg("inplace") = false, py::arg("min_bytes") = py::none(),
      py::arg("max_bytes") = py::none(), "The Program of a built-in algorithm");
  m.def(
      "load",
      [](const std::string& path) { return load_result_or_raise(ef::load_program_file(path)); },
      py::arg("path"), "Loads an EF JSON or MSCCL XML file (chosen by content)");
  m.def(
      "loads",
      [](const std::string& text, const std::string& name) {
        return load_result_or_raise(ef::load_program_text(text, name));
      },
      py::arg("text"), py::arg("name") = "<memory>",
      "Parses EF JSON or MSCCL XML text (chosen by content)");
}
