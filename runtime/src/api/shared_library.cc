// libefccl.so: the runtime is linked in whole (its API objects define the exported symbols);
// this file only gives the target a source, and the library its ELF note.
namespace efccl::runtime {
extern const char kSharedLibraryName[] = "libefccl.so";
}  // namespace efccl::runtime

// Tells a loaded libefccl.so apart from a real NCCL under any file name, whatever it exports
// (EFCCL_FALLBACK=nccl refuses to fall back to an efccl: fallback.cc). Name "efccl", type
// 0xefcc1, no description; a PT_NOTE segment maps it.
asm(R"(
  .pushsection .note.efccl, "a", @note
  .balign 4
  .long 6
  .long 0
  .long 0xefcc1
  .asciz "efccl"
  .balign 4
  .popsection
)");
