// libefccl.so: the runtime is linked in whole (its API objects define the exported symbols);
// this file only gives the target a source.
namespace efccl::runtime {
extern const char kSharedLibraryName[] = "libefccl.so";
}  // namespace efccl::runtime
