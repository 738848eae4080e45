"""Command-line tail shared by the GC3 examples: print or save the compiled program."""

import argparse
import os
import sys


def parser(description):
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--json", action="store_true", help="print EF JSON instead of MSCCL XML")
    p.add_argument("-o", "--output", help="write the program here (.xml: MSCCL XML, else EF JSON)")
    p.add_argument("--protocol", default="Simple", choices=["Simple", "LL", "LL128"])
    return p


def emit(prog, args):
    """Prints (or, with -o, saves) the compiled program of an MSCCLProgram. Custom collectives
    are printed as EF JSON: MSCCL XML cannot state their postconditions.

    Under `efccl compile` (EFCCL_COMPILE_OUTPUT set) the program was saved to the command's
    -o file when its `with` block ended: nothing is printed.

    Under msccl-tools itself (the scripts run there after `efccl` is replaced by `msccl` in
    their imports) only MSCCL XML exists: it is printed whatever the flags say."""
    if not hasattr(prog, "generate_json"):
        print(prog.generate_xml())
    elif os.environ.get("EFCCL_COMPILE_OUTPUT"):
        return
    elif args.output:
        prog.save(args.output)
    elif args.json or prog.collective.name == "custom":
        sys.stdout.write(prog.generate_json())
    else:
        print(prog.generate_xml())
