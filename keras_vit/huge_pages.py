"""Transparent huge pages for the memory glibc's malloc maps for large blocks.

XLA:CPU allocates the temporary buffers of a compiled program on every call and frees them at
its end. glibc's malloc serves a block that large with a fresh `mmap` and gives it back with
`munmap`, so every call touches new pages, and the kernel faults in and zeroes each 4 KiB page
anew: a JAX mixed_bfloat16 ViT-B/16 train step at batch 8 took 362,000 page faults and 0.65-1.0 s
of system time per step on a 2-core AMD EPYC. With glibc's `glibc.malloc.hugetlb=1` tunable
(glibc 2.35 and later) malloc asks the kernel for transparent huge pages on those mappings
(`madvise(MADV_HUGEPAGE)`), 2 MiB at a time: 1,400 faults per step, and the step 1.13x faster;
mixed_bfloat16 inference 1.08x at batch 8, the float32 train step 1.04x (benchmarks/README.md).
TensorFlow and PyTorch keep most of their memory between calls and change little.

glibc reads its tunables when a process starts, from the GLIBC_TUNABLES environment variable,
so a running process cannot switch them on for itself: `restart_with_huge_pages()` starts the
same command again with the variable set. The `keras-vit` commands that run models (finetune,
vtab, evaluate, fewshot, explain) call it first thing. The demo does not: its 16-32 px models
allocate little, and it ran no faster with huge pages (62-64 s against 55-62 s, more system time
zeroing 2 MiB pages). It does nothing where the tunable changes nothing: not glibc 2.35 or later,
or the kernel's transparent huge pages set to `always` (already on) or `never` (off); nor where
GLIBC_TUNABLES already names the tunable, or KERAS_VIT_HUGE_PAGES=0.

This module imports nothing heavy, so that a command can call it before Keras loads.
"""

import os
import sys

#: The glibc malloc tunable that backs large blocks with transparent huge pages.
TUNABLE = "glibc.malloc.hugetlb=1"

#: Where Linux says when it hands out transparent huge pages: `always`, `madvise` or `never`.
THP_MODE_FILE = "/sys/kernel/mm/transparent_hugepage/enabled"


def glibc_version():
    """The (major, minor) version of the C library this process runs on, or None when it is not
    glibc."""
    try:
        name, version = os.confstr("CS_GNU_LIBC_VERSION").split()
        major, minor = version.split(".")[:2]
        return (int(major), int(minor)) if name == "glibc" else None
    except (AttributeError, OSError, ValueError, TypeError):
        return None


def transparent_huge_page_mode(path=THP_MODE_FILE):
    """The kernel's transparent huge page mode (`always`, `madvise`, `never`), or None where the
    kernel does not say (not Linux, or no transparent huge pages)."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return None
    start, end = text.find("["), text.find("]")
    return text[start + 1 : end] if 0 <= start < end else None


#: Default of huge_pages_environment's `libc` and `thp_mode`: this machine's.
_THIS_MACHINE = object()


def huge_pages_environment(environ=None, libc=_THIS_MACHINE, thp_mode=_THIS_MACHINE):
    """The environment variables to add so that a process started with them gets huge pages for
    its large blocks: {"GLIBC_TUNABLES": ...} (the tunables already set, plus TUNABLE), or {}
    where that would change nothing (see the module docstring).

    Args:
        environ: the environment to extend (default: os.environ).
        libc: the glibc version as (major, minor), None for another C library (default: this
            process's).
        thp_mode: the kernel's transparent huge page mode, None where it has none (default: read
            from THP_MODE_FILE).
    """
    environ = os.environ if environ is None else environ
    if environ.get("KERAS_VIT_HUGE_PAGES", "").strip() == "0":
        return {}
    tunables = environ.get("GLIBC_TUNABLES", "")
    if "glibc.malloc.hugetlb=" in tunables:
        return {}  # the user's own choice, kept
    libc = glibc_version() if libc is _THIS_MACHINE else libc
    if libc is None or tuple(libc) < (2, 35):
        return {}
    mode = transparent_huge_page_mode() if thp_mode is _THIS_MACHINE else thp_mode
    if mode != "madvise":
        return {}
    return {"GLIBC_TUNABLES": f"{tunables}:{TUNABLE}" if tunables else TUNABLE}


def started_with_huge_pages():
    """Whether glibc's malloc in this process backs large blocks with huge pages: the process
    started with the tunable in GLIBC_TUNABLES (read from /proc/self/environ, the environment it
    started with), or the kernel gives every mapping huge pages (`always`)."""
    if transparent_huge_page_mode() == "always":
        return True
    try:
        with open("/proc/self/environ", "rb") as f:
            start = f.read().split(b"\0")
    except OSError:
        return False
    for entry in start:
        if entry.startswith(b"GLIBC_TUNABLES="):
            return any(t.strip() in (b"glibc.malloc.hugetlb=1", b"glibc.malloc.hugetlb=2")
                       for t in entry.split(b"=", 1)[1].split(b":"))
    return False


def restart_with_huge_pages():
    """Start this process's command again, in place (`os.execve`), with huge_pages_environment()
    added, where it adds something; otherwise return False and go on.

    Call it first thing in a script's main block, before anything with side effects: the command
    runs again from its start. It does not restart an interactive session (a notebook, the REPL,
    `python -i`) or a script read from standard input, and returns False there.

    Example:
        >>> if __name__ == "__main__":  # doctest: +SKIP
        ...     keras_vit.performance.restart_with_huge_pages()
        ...     main()
    """
    extra = huge_pages_environment()
    if not extra or not _can_restart():
        return False
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
    try:
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], {**os.environ, **extra})
    except OSError:
        return False  # go on as started
    return True  # not reached: execve replaces the process


def _can_restart():
    """A command that can run again as it started: a script file, `-m module` or `-c code`; not a
    REPL, a notebook kernel or a script read from standard input."""
    if sys.flags.interactive or hasattr(sys, "ps1") or "IPython" in sys.modules or "ipykernel" in sys.modules:
        return False
    if not getattr(sys, "orig_argv", None) or not sys.executable:
        return False
    script = sys.argv[0] if sys.argv else ""
    return script == "-c" or (script not in ("", "-") and os.path.isfile(script))
