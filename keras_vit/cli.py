"""The `keras-vit` command. Each subcommand lives in keras_vit/commands/<name>.py and provides
`add_parser(subparsers)` (which sets `func` on its parser).

The command is quiet and quick: TensorFlow's C++ start-up logs are silenced before any backend
loads (unless the user set TF_CPP_MIN_LOG_LEVEL), the command modules import Keras, TensorFlow
and the rest only inside the subcommand that runs, and a user error (a missing file, an unknown
preset, weights that cannot be downloaded offline, ...) ends in one line

    keras-vit <command>: error: <what was wrong and how to fix it>

and exit status 2, without a traceback.
"""

import argparse
import contextlib
import copy
import importlib
import importlib.abc
import importlib.util
import os
import re
import shutil
import sys
import tempfile
import warnings

#: Subcommand modules under keras_vit.commands, in the order `keras-vit --help` lists them.
COMMANDS = ["explain", "finetune", "evaluate", "vtab", "report", "fewshot", "presets", "convert", "export"]


#: TensorFlow start-up lines that TF_CPP_MIN_LOG_LEVEL does not reach (absl logs them before it
#: is initialised); dropped while TensorFlow is imported, everything else is passed through.
_TENSORFLOW_NOISE = re.compile(
    r"absl::InitializeLog|cudart_stub\.cc|cuda_(dnn|fft|blas|executor)\.cc|cpu_feature_guard\.cc|"
    r"rebuild TensorFlow with the appropriate compiler flags|oneDNN custom operations are on|"
    r"Unable to register cu(DNN|FFT|BLAS) factory|computation placer already registered|TF-TRT Warning"
)


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """--help shows each option's default, where it has one (not for flags, nor where the help
    text already says what happens by default)."""

    def _shows_default(self, action):
        return (
            action.option_strings
            and not any(action.default is nothing for nothing in (None, False, argparse.SUPPRESS))
            and not isinstance(action, argparse._HelpAction)
        )

    def _get_help_string(self, action):
        text = action.help or ""
        if self._shows_default(action) and "default" not in text.lower():
            text += " (default: %(default)s)"
        return text

    def _format_action(self, action):
        if not action.help and self._shows_default(action):
            action = copy.copy(action)
            action.help = "default: %(default)s"
        return super()._format_action(action)


class _Parser(argparse.ArgumentParser):
    """The parser of every subcommand: defaults shown in --help."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)


def build_parser():
    parser = argparse.ArgumentParser(prog="keras-vit", description="Vision Transformers for Keras 3.")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMANDS:
        importlib.import_module(f"keras_vit.commands.{name}").add_parser(subparsers)
    return parser


@contextlib.contextmanager
def _stderr_filtered(pattern):
    """Drop the lines of file descriptor 2 (C++ logs included) that match `pattern`."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            kept = [ln for ln in capture.read().decode(errors="replace").splitlines(True) if not pattern.search(ln)]
            sys.stderr.write("".join(kept))
            sys.stderr.flush()


class _QuietImport(importlib.abc.MetaPathFinder):
    """Import `name` (when something first imports it) with its stderr lines matching
    `pattern` dropped; then step aside.

    A lookup that does not import (`importlib.util.find_spec(name)`, which etils makes when
    JAX's compilation cache starts, to ask whether TensorFlow is installed) leaves the finder in
    place: it steps aside only once the module is executed."""

    def __init__(self, name, pattern):
        self.name, self.pattern, self._looking = name, pattern, False

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name or self._looking:
            return None
        self._looking = True  # the lookup below asks the finders again, this one included
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._looking = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module, pattern, finder = spec.loader.exec_module, self.pattern, self

        def quiet_exec_module(module):
            if finder in sys.meta_path:
                sys.meta_path.remove(finder)
            with _stderr_filtered(pattern):
                exec_module(module)

        spec.loader.exec_module = quiet_exec_module
        return spec


def quiet_environment():
    """Silence the backends' start-up logs, unless the user asked for them (TF_CPP_MIN_LOG_LEVEL
    set). Nothing is imported here: TensorFlow is quietened when a command first imports it."""
    if "TF_CPP_MIN_LOG_LEVEL" in os.environ:
        return  # the user chose TensorFlow's log level: show what it lets through
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"  # also read by XLA (JAX): "failed call to cuInit" on CPU hosts
    if "tensorflow" not in sys.modules and not any(isinstance(f, _QuietImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _QuietImport("tensorflow", _TENSORFLOW_NOISE))


def user_error_types():
    """The exception classes that mean "bad input", from the modules loaded so far (a command
    that failed before loading a module cannot have raised its errors)."""
    types = [FileNotFoundError, NotADirectoryError, IsADirectoryError, ValueError, ImportError]
    for module, names in (
        ("keras_vit.hub", ("HubError",)),
        ("keras_vit.errors", ("CheckpointError",)),
        ("keras_vit.data.tfds_sources", ("DatasetNotPreparedError",)),
        ("keras_vit.data", ("DatasetNotPreparedError",)),
    ):
        loaded = sys.modules.get(module)
        for name in names:
            if loaded is not None and isinstance(getattr(loaded, name, None), type):
                types.append(getattr(loaded, name))
    return tuple(types)


#: The library's advice to start from random weights, as a clause that can be taken out of its sentence.
_RANDOM_INIT_CLAUSE = re.compile(r"[;,] or (?:pass )?weights=None for a randomly initialised model")


def error_message(error, takes_weights=True):
    """The text after `keras-vit <command>: error: ` for a user error. `takes_weights`: the command
    has a `--weights` option (the library's advice to pass weights=None becomes `--weights none`;
    a command without the option, such as `convert`, does not give that advice)."""
    text = str(error).strip() or type(error).__name__
    if isinstance(error, (FileNotFoundError, NotADirectoryError, IsADirectoryError)) and error.filename:
        text = text if str(error.filename) in text else f"{text}: {error.filename}"
    hub = sys.modules.get("keras_vit.hub")
    offline = hub is not None and isinstance(error, getattr(hub, "OfflineError", ()))
    if not takes_weights:
        text = _RANDOM_INIT_CLAUSE.sub("", text)
    # The library speaks of the Python argument; on the command line it is a flag.
    text = re.sub(r"\bweights=None\b", "--weights none", text)
    if offline and takes_weights and "--weights none" not in text:
        text += " Or pass --weights none (with --arch) to start from a randomly initialised model."
    return " ".join(text.split()) if offline else text


def _out_folder(args):
    out = getattr(args, "out", None)
    return os.path.abspath(out) if isinstance(out, str) and out else None


def _writes_run_folders():
    """False in the processes other than process 0 of a multi-process job (they write nothing)."""
    distribution = sys.modules.get("keras_vit.distribution")  # loaded by any command that joined a job
    return distribution is None or distribution.is_first_process()


def _remove_if_left_empty(folder, existed):
    """A failed run leaves no run folder behind that holds nothing but its config.json (nor
    empty folders it created inside)."""
    if folder is None or existed or not os.path.isdir(folder) or not _writes_run_folders():
        return
    for root, dirs, files in os.walk(folder, topdown=False):
        if [f for f in files if not (root == folder and f == "config.json")]:
            return
    shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def _one_line_warnings(command):
    """keras_vit's own warnings (a file left out, ...) as one line `keras-vit <command>: warning:
    ...`, without Python's file, line number and source line; other libraries' as they are."""
    package = os.path.dirname(os.path.abspath(__file__)) + os.sep
    default = warnings.formatwarning

    def format_warning(message, category, filename, lineno, line=None):
        if os.path.abspath(str(filename)).startswith(package):
            return f"keras-vit {command}: warning: {' '.join(str(message).split())}\n"
        return default(message, category, filename, lineno, line)

    warnings.formatwarning = format_warning
    try:
        yield
    finally:
        warnings.formatwarning = default


#: The commands that run models at their full size (training, evaluation, features, attention
#: maps): from the command line they start again under glibc's huge pages where those help
#: (keras_vit.huge_pages). The others start as they are.
HUGE_PAGE_COMMANDS = ("finetune", "vtab", "evaluate", "fewshot", "explain")


def main(argv=None):
    if argv is None:
        command = next((arg for arg in sys.argv[1:] if not arg.startswith("-")), None)
        if command in HUGE_PAGE_COMMANDS:
            from keras_vit.huge_pages import restart_with_huge_pages

            restart_with_huge_pages()
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    quiet_environment()
    out = _out_folder(args)
    out_existed = out is not None and os.path.exists(out)
    try:
        with _one_line_warnings(args.command):
            status = args.func(args) or 0
    except KeyboardInterrupt:
        _remove_if_left_empty(out, out_existed)
        print(f"keras-vit {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as error:
        _remove_if_left_empty(out, out_existed)
        if not isinstance(error, user_error_types()):
            raise  # a bug: the traceback is what a report needs
        print(f"keras-vit {args.command}: error: {error_message(error, 'weights' in vars(args))}", file=sys.stderr)
        return 2
    if status:
        _remove_if_left_empty(out, out_existed)
    return status


if __name__ == "__main__":
    sys.exit(main())
