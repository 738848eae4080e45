// `efccl`: check, run and convert EF programs (EF JSON and MSCCL XML, chosen by content).
//
// Exit codes: 0 success, 1 a file is invalid or a run failed, 2 usage error.

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "efccl/algorithms/algorithm_library.h"
#include "efccl/ef/datatype.h"
#include "efccl/ef/json_io.h"
#include "efccl/ef/load.h"
#include "efccl/ef/msccl_xml.h"
#include "efccl/ef/validate.h"
#include "efccl/host/executor.h"
#include "args.h"
#include "plan_command.h"
#include "topo_command.h"

extern char** environ;

namespace {

using efccl::Diagnostics;
namespace ef = efccl::ef;
namespace host = efccl::host;
using efccl::cli::Args;
using efccl::cli::parse_i32;
using efccl::cli::parse_u64;
using efccl::cli::UsageError;

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;

constexpr std::string_view kUsage =
    "usage: efccl COMMAND [ARGS]\n"
    "\n"
    "Commands (FILE is EF JSON or MSCCL XML, recognised by its content):\n"
    "  validate FILE...            check every rule; one line per problem on stderr\n"
    "  run-host FILE [--count N] [--dtype T] [--op O] [--inplace|--outofplace] [--seed S]\n"
    "                [--slot-bytes B] [--slots K]\n"
    "                              run on the host executor with random inputs and verify;\n"
    "                              prints one line starting with PASS or FAIL\n"
    "  check FILE...               run-host over a matrix of datatypes, ops and every mode\n"
    "                              the file allows, each also tiled into 10 pipelined\n"
    "                              pieces per chunk; prints a verdict table\n"
    "  import-msccl IN.xml -o OUT.json\n"
    "  export-msccl IN.json -o OUT.xml\n"
    "  show FILE                   human summary of a program\n"
    "  list-algorithms             the built-in algorithm library\n"
    "  generate NAME (--ranks N | --nodes N --gpus-per-node G) [--instances R]\n"
    "           [--channels C] [--protocol Simple|LL|LL128] [--root R] [--inplace] -o FILE\n"
    "                              write a library algorithm as EF JSON (.json) or MSCCL XML\n"
    "                              (.xml), chosen by the output's extension; --ranks defaults\n"
    "                              to nodes x gpus-per-node\n"
    "  compile PROG.py -o FILE [-- ARGS...]\n"
    "                              run a Python program written with efccl.language (ARGS\n"
    "                              are passed to it) and write the program it compiles to\n"
    "                              FILE: MSCCL XML when FILE ends in .xml, else EF JSON;\n"
    "                              the result is validated. The efccl package is looked up\n"
    "                              in $EFCCL_PYTHONPATH, else in <bin>/../python\n"
    "  topo [--detect | --xml FILE | --preset NAME | --json-file FILE] [--nodes N]\n"
    "       [--json] [--svg FILE]\n"
    "                              the machine as a graph (docs/topology.md): detected (the\n"
    "                              default; NCCL_TOPO_FILE is honoured), NCCL topology XML, a\n"
    "                              preset (dgx-h100, hgx-h200, nimble-h100, h200-nv18-x2) or\n"
    "                              efccl's topology JSON; --nodes N makes a cluster of N such\n"
    "                              hosts joined by rail switches. Prints a summary, or the\n"
    "                              JSON with --json; --svg FILE also draws it\n"
    "  plan --topology PRESET|FILE [--nodes N] --demand D.json [--json] [-o PROG.json]\n"
    "       [--svg FILE] [--bench] [--min-split-bytes B] [--chunk-bytes B]\n"
    "       [--relays forward|slot-device|forward-or-slot-device]\n"
    "                              the balancer's plan (docs/balancer.md) for the demand\n"
    "                              {\"ranks\": N, \"bytes\": [[...], ...]}, rank r on the r-th\n"
    "                              GPU of the topology (a preset, NCCL XML or topology JSON):\n"
    "                              each pair's bytes per path, the busiest link's load, the\n"
    "                              timing model's time of the balanced and the direct program;\n"
    "                              -o writes the balanced EF program (run-host verifies it),\n"
    "                              --svg the link loads before and after, --bench times plans\n"
    "  help                        this text\n"
    "\n"
    "Exit codes: 0 success, 1 invalid input or failed run, 2 usage error (including an\n"
    "unknown command, option, datatype, operator, algorithm or preset name).\n"
    "\n"
    "Datatypes: int8 uint8 int32 uint32 int64 uint64 half float double bfloat16 f8e4m3 f8e5m2\n"
    "Ops: sum prod min max avg premulsum\n";

void print_diagnostics(const Diagnostics& diagnostics) {
  for (const auto& d : diagnostics) std::cerr << d.to_string() << '\n';
}

/// Loads and validates; prints every problem. Returns the program only when it is valid;
/// otherwise `why` (when given) says in a few words what failed: "no such file", "cannot be
/// read", "too large" or "invalid program".
std::optional<ef::Program> load_valid(const std::string& path, std::string* why = nullptr) {
  auto loaded = ef::load_program_file(path);
  if (!loaded.diagnostics.empty() || !loaded.program) {
    print_diagnostics(loaded.diagnostics);
    if (why != nullptr) {
      *why = "invalid program";
      for (const auto& d : loaded.diagnostics) {
        if (d.rule == "io")
          *why = d.message.find("no such file") != std::string::npos ? "no such file"
                                                                     : "cannot be read";
        if (d.rule == "file-too-large") *why = "too large";
      }
    }
    return std::nullopt;
  }
  auto diagnostics = ef::validate(*loaded.program);
  if (!diagnostics.empty()) {
    print_diagnostics(diagnostics);
    if (why != nullptr) *why = "invalid program";
    return std::nullopt;
  }
  return std::move(loaded.program);
}

bool write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) {
    std::cerr << path << ": cannot open for writing\n";
    return false;
  }
  out << text;
  out.close();
  if (!out) {
    std::cerr << path << ": write failed\n";
    return false;
  }
  return true;
}

int cmd_validate(const std::vector<std::string>& argv) {
  Args args(argv, {}, {});
  if (args.positional().empty()) throw UsageError{"validate needs at least one FILE"};
  int rc = kExitOk;
  for (const auto& path : args.positional())
    if (!load_valid(path)) rc = kExitFailed;
  return rc;
}

/// premulsum needs one scalar per rank; these are exact in every floating type.
std::vector<double> default_premul_scalars(int nranks) {
  std::vector<double> s(static_cast<std::size_t>(nranks));
  for (int r = 0; r < nranks; ++r) s[static_cast<std::size_t>(r)] = 1.0 + 0.25 * (r % 4);
  return s;
}

/// The count run-host uses when none is given: 64 elements per chunk, enough that a program
/// touching the wrong chunk or element cannot pass by coincidence.
constexpr uint64_t kDefaultChunkElements = 64;
uint64_t default_count(const ef::Program& p) {
  return ef::count_granularity(p) * kDefaultChunkElements;
}

/// `check`'s second run of every cell: slots of 7 elements, so every chunk is cut into
/// ceil(64 / 7) = 10 tiles, the last one partial (pipelining and back-pressure exercised).
constexpr std::size_t kTiledSlotElements = 7;

host::ExecOptions base_options(const ef::Program& p, ef::DataType dtype, ef::RedOp op,
                               bool inplace) {
  host::ExecOptions o;
  o.count = default_count(p);
  o.dtype = dtype;
  o.op = op;
  o.inplace = inplace;
  if (op == ef::RedOp::kPreMulSum) o.premul_scalars = default_premul_scalars(p.nranks);
  return o;
}

int cmd_run_host(const std::vector<std::string>& argv) {
  Args args(argv, {"--count", "--dtype", "--op", "--seed", "--slot-bytes", "--slots"},
            {"--inplace", "--outofplace"});
  if (args.positional().size() != 1) throw UsageError{"run-host needs exactly one FILE"};
  if (args.has("--inplace") && args.has("--outofplace"))
    throw UsageError{"--inplace and --outofplace exclude each other"};
  ef::DataType dtype = ef::DataType::kFloat32;
  if (auto t = args.value("--dtype")) {
    auto parsed = ef::parse_data_type(*t);
    if (!parsed) throw UsageError{"--dtype: unknown datatype '" + *t + "'"};
    dtype = *parsed;
  }
  ef::RedOp op = ef::RedOp::kSum;
  if (auto o = args.value("--op")) {
    auto parsed = ef::parse_red_op(*o);
    if (!parsed) throw UsageError{"--op: unknown operator '" + *o + "'"};
    op = *parsed;
  }
  const uint64_t seed = args.value("--seed") ? parse_u64("--seed", *args.value("--seed")) : 1;
  std::optional<uint64_t> count;
  if (auto c = args.value("--count")) count = parse_u64("--count", *c);
  std::optional<uint64_t> slot_bytes, slots;
  if (auto v = args.value("--slot-bytes")) slot_bytes = parse_u64("--slot-bytes", *v);
  if (auto v = args.value("--slots")) slots = parse_u64("--slots", *v);
  if (slot_bytes && *slot_bytes == 0) throw UsageError{"--slot-bytes must be at least 1"};
  if (slots && (*slots == 0 || *slots > 1u << 20))
    throw UsageError{"--slots must be between 1 and 1048576"};

  const std::string& path = args.positional()[0];
  std::string why;
  auto program = load_valid(path, &why);
  if (!program) {
    std::cout << "FAIL " << path << ": " << why << " (see the messages above)\n";
    return kExitFailed;
  }
  bool inplace;
  if (args.has("--inplace")) {
    inplace = true;
  } else if (args.has("--outofplace")) {
    inplace = false;
  } else {
    inplace = !program->outofplace;  // out-of-place when the program allows it
  }
  auto options = base_options(*program, dtype, op, inplace);
  if (count) options.count = *count;
  if (slot_bytes) options.slot_bytes = *slot_bytes;
  if (slots) options.connection_slots = static_cast<int>(*slots);

  auto result = host::run_and_verify(*program, options, seed);
  std::cout << result.message << '\n';
  return result.pass ? kExitOk : kExitFailed;
}

/// The datatype/operator pairs `check` runs on reducing collectives (the matrix).
struct MatrixEntry {
  ef::DataType dtype;
  ef::RedOp op;
};
constexpr MatrixEntry kCheckMatrix[] = {
    {ef::DataType::kFloat32, ef::RedOp::kSum},   {ef::DataType::kBFloat16, ef::RedOp::kMax},
    {ef::DataType::kInt32, ef::RedOp::kProd},    {ef::DataType::kFloat16, ef::RedOp::kAvg},
    {ef::DataType::kFp8E4M3, ef::RedOp::kSum},
};

std::string pad(std::string s, std::size_t width) {
  if (s.size() < width) s.append(width - s.size(), ' ');
  return s;
}

int cmd_check(const std::vector<std::string>& argv) {
  Args args(argv, {"--seed"}, {});
  if (args.positional().empty()) throw UsageError{"check needs at least one FILE"};
  const uint64_t seed = args.value("--seed") ? parse_u64("--seed", *args.value("--seed")) : 1;

  std::string header = pad("file", 40) + pad("collective", 14) + pad("ranks", 6) + pad("mode", 11);
  for (const auto& m : kCheckMatrix)
    header += pad(std::string(ef::to_string(m.dtype)) + "/" + std::string(ef::to_string(m.op)), 15);
  std::cout << header << '\n';

  int failures = 0, passes = 0;
  for (const auto& path : args.positional()) {
    std::string name = path.substr(path.find_last_of('/') == std::string::npos
                                       ? 0
                                       : path.find_last_of('/') + 1);
    std::string why;
    auto program = load_valid(path, &why);
    if (!program) {
      std::cout << pad(name, 40) << "FAIL: " << why << " (see the messages above)\n";
      ++failures;
      continue;
    }
    for (bool inplace : host::allowed_inplace_modes(*program)) {
      std::string line = pad(name, 40) + pad(std::string(ef::to_string(program->collective)), 14) +
                         pad(std::to_string(program->nranks), 6) +
                         pad(inplace ? "inplace" : "outofplace", 11);
      for (const auto& m : kCheckMatrix) {
        auto options = base_options(*program, m.dtype, m.op, inplace);
        auto result = host::run_and_verify(*program, options, seed);
        if (result.pass) {  // the same call again, tiled
          options.slot_bytes = kTiledSlotElements * ef::size_of(m.dtype);
          result = host::run_and_verify(*program, options, seed + 1);
        }
        line += pad(result.pass ? "PASS" : "FAIL", 15);
        if (result.pass) {
          ++passes;
        } else {
          ++failures;
          std::cerr << name << " " << ef::to_string(m.dtype) << "/" << ef::to_string(m.op) << " "
                    << (inplace ? "inplace" : "outofplace") << ": " << result.message << '\n';
        }
      }
      std::cout << line << '\n';
    }
  }
  std::cout << "\n" << passes << " runs passed, " << failures << " failed\n";
  return failures == 0 ? kExitOk : kExitFailed;
}

int cmd_convert(const std::vector<std::string>& argv, bool to_json) {
  Args args(argv, {"-o"}, {});
  const char* name = to_json ? "import-msccl" : "export-msccl";
  if (args.positional().size() != 1 || !args.value("-o"))
    throw UsageError{std::string(name) + " needs one input FILE and -o OUTPUT"};
  auto program = load_valid(args.positional()[0]);
  if (!program) return kExitFailed;
  const auto expected = to_json ? ef::SourceMap::Format::kMscclXml : ef::SourceMap::Format::kJson;
  if (program->source.format != expected) {
    std::cerr << args.positional()[0] << ": expected " << (to_json ? "MSCCL XML" : "EF JSON")
              << " input\n";
    return kExitFailed;
  }
  std::string text;
  if (to_json) {
    text = ef::save_json(*program);
  } else {
    auto xml = ef::save_msccl_xml(*program);
    if (!xml) {
      std::cerr << args.positional()[0] << ": cannot export: " << xml.status().message() << '\n';
      return kExitFailed;
    }
    text = std::move(*xml);
  }
  return write_file(*args.value("-o"), text) ? kExitOk : kExitFailed;
}

int cmd_show(const std::vector<std::string>& argv) {
  Args args(argv, {}, {});
  if (args.positional().size() != 1) throw UsageError{"show needs exactly one FILE"};
  auto program = load_valid(args.positional()[0]);
  if (!program) return kExitFailed;
  const ef::Program& p = *program;
  std::cout << "name:           " << p.name << '\n'
            << "collective:     " << ef::to_string(p.collective);
  if (p.collective == ef::Collective::kBroadcast || p.collective == ef::Collective::kReduce ||
      p.collective == ef::Collective::kGather || p.collective == ef::Collective::kScatter)
    std::cout << " (root " << p.root << ")";
  std::cout << '\n'
            << "protocol:       " << ef::to_string(p.protocol) << '\n'
            << "ranks:          " << p.nranks << '\n'
            << "chunks/loop:    " << p.nchunksperloop << " (count granularity "
            << ef::count_granularity(p) << ")\n"
            << "channels:       " << p.nchannels << '\n'
            << "modes:          " << (p.inplace ? "inplace " : "") << (p.outofplace ? "outofplace" : "")
            << '\n'
            << "bytes:          " << p.min_bytes << " .. "
            << (p.max_bytes ? std::to_string(*p.max_bytes) : std::string("unbounded")) << '\n';

  std::map<ef::OpCode, uint64_t> ops_by_type;
  std::set<std::tuple<int, int, int>> connections;
  std::size_t min_tbs = SIZE_MAX, max_tbs = 0;
  uint64_t total_ops = 0;
  for (std::size_t r = 0; r < p.ranks.size(); ++r) {
    const auto& rank = p.ranks[r];
    min_tbs = std::min(min_tbs, rank.threadblocks.size());
    max_tbs = std::max(max_tbs, rank.threadblocks.size());
    for (const auto& tb : rank.threadblocks) {
      if (tb.send_peer >= 0) connections.insert({static_cast<int>(r), tb.send_peer, tb.channel});
      for (const auto& op : tb.ops) {
        ++ops_by_type[op.code];
        ++total_ops;
      }
    }
  }
  std::cout << "threadblocks:   " << (p.ranks.empty() ? 0 : min_tbs);
  if (max_tbs != min_tbs) std::cout << " .. " << max_tbs;
  std::cout << " per rank\n"
            << "connections:    " << connections.size() << " (sender, receiver, channel)\n"
            << "ops:            " << total_ops << " total:";
  for (const auto& [code, n] : ops_by_type) std::cout << ' ' << ef::to_string(code) << '=' << n;
  std::cout << "\nbuffers (chunks: input / output / scratch):\n";
  for (std::size_t r = 0; r < p.ranks.size(); ++r) {
    const auto& rank = p.ranks[r];
    std::cout << "  rank " << r << ": " << rank.input_chunks << " / " << rank.output_chunks << " / "
              << rank.scratch_chunks << ", " << rank.threadblocks.size() << " threadblocks\n";
  }
  return kExitOk;
}

int cmd_list_algorithms(const std::vector<std::string>& argv) {
  Args args(argv, {}, {});
  if (!args.positional().empty()) throw UsageError{"list-algorithms takes no arguments"};
  const auto algorithms = efccl::algorithms::list_algorithms();
  std::size_t name_width = 0;  // the longest name and a space
  for (const auto& a : algorithms) name_width = std::max(name_width, a.name.size() + 1);
  for (const auto& a : algorithms) {
    std::string range = std::to_string(a.default_min_bytes) + ".." +
                        (a.default_max_bytes ? std::to_string(*a.default_max_bytes) : "");
    std::cout << pad(a.name, name_width) << pad(std::string(ef::to_string(a.collective)), 14)
              << pad(range, 16) << a.description << '\n';
  }
  return kExitOk;
}

int cmd_generate(const std::vector<std::string>& argv) {
  Args args(argv,
            {"--ranks", "--nodes", "--gpus-per-node", "--instances", "--channels", "--protocol",
             "--root", "-o"},
            {"--inplace"});
  if (args.positional().size() != 1) throw UsageError{"generate needs exactly one NAME"};
  if (!args.value("-o")) throw UsageError{"generate needs -o FILE"};
  const std::string& name = args.positional()[0];
  const auto algorithms = efccl::algorithms::list_algorithms();
  if (std::none_of(algorithms.begin(), algorithms.end(),
                   [&](const auto& a) { return a.name == name; }))
    throw UsageError{"unknown algorithm '" + name + "' (`efccl list-algorithms` lists them)"};
  efccl::algorithms::AlgorithmParams params;
  if (auto v = args.value("--nodes")) params.nodes = parse_i32("--nodes", *v, 1, 4096);
  if (auto v = args.value("--gpus-per-node"))
    params.gpus_per_node = parse_i32("--gpus-per-node", *v, 1, 4096);
  if (auto v = args.value("--ranks")) {
    params.ranks = parse_i32("--ranks", *v, 1, 4096);
  } else if (args.value("--nodes") && args.value("--gpus-per-node")) {
    const int64_t ranks = int64_t{params.nodes} * params.gpus_per_node;
    if (ranks > 4096)
      throw UsageError{"--nodes x --gpus-per-node is " + std::to_string(ranks) +
                       " ranks; at most 4096"};
    params.ranks = static_cast<int32_t>(ranks);
  } else {
    throw UsageError{"generate needs --ranks N, or --nodes N and --gpus-per-node G"};
  }
  if (auto v = args.value("--instances")) params.instances = parse_i32("--instances", *v, 1, 64);
  if (auto v = args.value("--channels")) params.channels = parse_i32("--channels", *v, 1, 64);
  if (auto v = args.value("--root")) params.root = parse_i32("--root", *v, 0, 4095);
  if (auto v = args.value("--protocol")) {
    auto protocol = ef::parse_protocol(*v);
    if (!protocol) throw UsageError{"--protocol: expected Simple, LL or LL128, got '" + *v + "'"};
    params.protocol = *protocol;
  }
  params.inplace = args.has("--inplace");

  auto program = efccl::algorithms::generate_algorithm(name, params);
  if (!program) {
    std::cerr << "efccl generate: " << program.status().message() << '\n';
    return kExitFailed;
  }
  const std::string out = *args.value("-o");
  const bool xml = out.size() >= 4 && out.compare(out.size() - 4, 4, ".xml") == 0;
  std::string text;
  if (xml) {
    auto saved = ef::save_msccl_xml(*program);
    if (!saved) {
      std::cerr << "efccl generate: cannot write MSCCL XML: " << saved.status().message() << '\n';
      return kExitFailed;
    }
    text = std::move(*saved);
  } else {
    text = ef::save_json(*program);
  }
  return write_file(out, text) ? kExitOk : kExitFailed;
}

/// The folder holding the efccl Python package: $EFCCL_PYTHONPATH, else <bin>/../python (for
/// build/bin/efccl that is build/python, where the build puts the package and _efccl).
std::string python_package_dir() {
  if (const char* env = std::getenv("EFCCL_PYTHONPATH"); env && *env) return env;
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "";
  return (exe.parent_path().parent_path() / "python").string();
}

int cmd_compile(const std::vector<std::string>& argv) {
  // Everything after `--` goes to the script untouched.
  auto dashes = std::find(argv.begin(), argv.end(), std::string("--"));
  const std::vector<std::string> own(argv.begin(), dashes);
  const std::vector<std::string> passthrough(dashes == argv.end() ? argv.end() : dashes + 1,
                                             argv.end());
  Args args(own, {"-o"}, {});
  if (args.positional().size() != 1 || !args.value("-o"))
    throw UsageError{"compile needs one PROG.py and -o FILE"};
  const std::string script = args.positional()[0];
  const std::string out = *args.value("-o");
  if (out.empty()) throw UsageError{"-o: empty path"};

  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_regular_file(script, ec)) {
    std::cerr << script << ": no such file\n";
    return kExitFailed;
  }
  // The script may change directory; it gets an absolute path.
  const fs::path out_abs = fs::absolute(out, ec);
  if (ec) {
    std::cerr << out << ": " << ec.message() << '\n';
    return kExitFailed;
  }
  fs::remove(out_abs, ec);
  if (ec) {
    std::cerr << out << ": cannot remove the old file: " << ec.message() << '\n';
    return kExitFailed;
  }

  // The child's environment: ours, with PYTHONPATH prefixed and EFCCL_COMPILE_OUTPUT set.
  std::vector<std::string> env;
  std::string pythonpath = python_package_dir();
  for (char** e = environ; e && *e; ++e) {
    std::string_view kv(*e);
    if (kv.rfind("PYTHONPATH=", 0) == 0) {
      std::string_view old = kv.substr(std::strlen("PYTHONPATH="));
      if (!old.empty()) pythonpath += (pythonpath.empty() ? "" : ":") + std::string(old);
      continue;
    }
    if (kv.rfind("EFCCL_COMPILE_OUTPUT=", 0) == 0) continue;
    env.emplace_back(kv);
  }
  env.push_back("PYTHONPATH=" + pythonpath);
  env.push_back("EFCCL_COMPILE_OUTPUT=" + out_abs.string());
  std::vector<char*> envp;
  for (auto& kv : env) envp.push_back(kv.data());
  envp.push_back(nullptr);

  std::vector<std::string> child_args = {"python3", script};
  child_args.insert(child_args.end(), passthrough.begin(), passthrough.end());
  std::vector<char*> child_argv;
  for (auto& a : child_args) child_argv.push_back(a.data());
  child_argv.push_back(nullptr);

  std::cout.flush();
  std::cerr.flush();
  pid_t pid = 0;
  const int spawn_rc =
      posix_spawnp(&pid, "python3", nullptr, nullptr, child_argv.data(), envp.data());
  if (spawn_rc != 0) {
    std::cerr << "efccl compile: cannot start python3: " << std::strerror(spawn_rc) << '\n';
    return kExitFailed;
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) {
      std::cerr << "efccl compile: waitpid: " << std::strerror(errno) << '\n';
      return kExitFailed;
    }
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    if (WIFEXITED(status))
      std::cerr << script << ": the program exited with status " << WEXITSTATUS(status) << '\n';
    else if (WIFSIGNALED(status))
      std::cerr << script << ": the program was killed by signal " << WTERMSIG(status) << '\n';
    else
      std::cerr << script << ": the program did not exit normally\n";
    fs::remove(out_abs, ec);  // no half-written result
    return kExitFailed;
  }
  if (!fs::exists(out_abs, ec)) {
    std::cerr << script << ": did not compile a program (no MSCCLProgram block ran to its end, "
              << "and XML() / JSON() were not called)\n";
    return kExitFailed;
  }
  if (!load_valid(out_abs.string())) {
    std::cerr << out << ": the compiled program is invalid (see the messages above)\n";
    return kExitFailed;
  }
  return kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + (argc > 0 ? 1 : 0), argv + argc);
  if (args.empty()) {
    std::cerr << kUsage;
    return kExitUsage;
  }
  const std::string command = args.front();
  args.erase(args.begin());
  try {
    if (command == "validate") return cmd_validate(args);
    if (command == "run-host") return cmd_run_host(args);
    if (command == "check") return cmd_check(args);
    if (command == "import-msccl") return cmd_convert(args, true);
    if (command == "export-msccl") return cmd_convert(args, false);
    if (command == "show") return cmd_show(args);
    if (command == "list-algorithms") return cmd_list_algorithms(args);
    if (command == "generate") return cmd_generate(args);
    if (command == "compile") return cmd_compile(args);
    if (command == "topo") return efccl::cli::cmd_topo(args);
    if (command == "plan") return efccl::cli::cmd_plan(args);
    if (command == "help" || command == "--help" || command == "-h") {
      std::cout << kUsage;
      return kExitOk;
    }
    throw UsageError{"unknown command '" + command + "'"};
  } catch (const UsageError& e) {
    std::cerr << "efccl: " << e.message << "\n\n" << kUsage;
    return kExitUsage;
  } catch (const std::exception& e) {
    // Library code reports errors as values; reaching here is a bug, reported, not a crash.
    std::cerr << "efccl: internal error: " << e.what() << '\n';
    return kExitFailed;
  }
}
