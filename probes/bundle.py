"""One bcc module for all the probes of a set: each probe's .bpf.c stays its own file, and the
loader compiles them together, so clang's fixed start (bcc parses its headers in three passes
per compile, ~0.5 CPU-s here) is paid once instead of once per probe (docs/performance.md).

Each probe's part is its source with gpujitter.h's per-probe half pasted in, its -D options
as #define lines (undefined after it, as are its own macros), and its names made its own:
TRACEPOINT_PROBE and RAW_TRACEPOINT_PROBE programs are named `<part>__tracepoint__...`
(two parts may hook the same tracepoint; bcc then does not attach them by itself, the part's
view does), and a map or function that another part of the module also defines is renamed
`<part>__name`. The probe sees the module through a PartView under its own names.

Parts may share a hook's program: each part in the module is announced to all of them as
GJ_PART_<NAME>, and to itself as GJ_THIS_PART (its number in the module, Bundle.part_id), so
that one part's program can call another's inline functions (sched's sched_switch runs
cstate's share of it: one program run per event instead of two), and the other part leaves
that hook unattached (load_part's `skip`) while the carrier's program is attached.

A part that does not compile is left out and the rest compiled again without it (the error
names its file), unless it is essential (the core, whose maps the others use: then none runs);
a part whose programs the kernel refuses fails on attach, in its view only.
"""

from __future__ import annotations

import atexit
import os
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpujitter.probes import tp_cookie
from gpujitter.probes.base import (
    BPF_DIR,
    COMPILE_FLAGS,
    SHARED_HEADER,
    ProbeContext,
    ProbeUnavailable,
    bpf_source,
    captured_output,
    compile_blocked,
    consume_rings,
    first_error_line,
)

_MAP = re.compile(
    r"\bBPF_(?:HASH|ARRAY|PERCPU_ARRAY|PERCPU_HASH|LRU_HASH|RINGBUF_OUTPUT|PERF_OUTPUT|QUEUE)\(\s*(\w+)"
)
_TABLE = re.compile(r'\bBPF_TABLE\(\s*"(\w+)"\s*,[^,]+,[^,]+,\s*(\w+)')
# A function defined (not only declared) at the start of a line:
# `static __always_inline struct x *name(...) {`.
_FUNC = re.compile(
    r"^(?:static\s+|__always_inline\s+|inline\s+)*(?:struct\s+)?\w+[\s*]+(\w+)\s*\([^;{]*\)\s*\{",
    re.M,
)
_STRUCT = re.compile(r"^struct\s+(\w+)\s*\{", re.M)
_DEFINE = re.compile(r"^\s*#\s*define\s+(\w+)", re.M)
_NAME = re.compile(r"\w+")
_TP_PREFIX, _RAW_PREFIX = "__tracepoint__", "__raw_tracepoint__"
_HOOK_NAMES = ("tracepoint__", "raw_tracepoint__")  # as TRACEPOINT_PROBE names programs


@dataclass(frozen=True, slots=True)
class ModulePart:
    """One probe's share of the module: `name` (a C identifier) prefixes its names.
    An essential part defines what the others use: the module is not built without it."""

    name: str
    bpf_file: Path  # the .bpf.c file
    cflags: tuple[str, ...] = ()
    essential: bool = False

    @property
    def prefix(self) -> str:
        """The name as a C identifier ("sched-noregs" -> "sched_noregs")."""
        return re.sub(r"\W", "_", self.name)


def defined_names(text: str) -> set[str]:
    """Maps, functions and struct tags a part defines (the extern maps are the core's)."""
    names = set(_MAP.findall(text)) | set(_FUNC.findall(text)) | set(_STRUCT.findall(text))
    return names | {n for kind, n in _TABLE.findall(text) if kind != "extern"}


def part_text(part: ModulePart, clashing: set[str], part_id: int = 1) -> str:
    """The part's C text for a bundle: options, its number, its hooks under its own names,
    its names that clash with another part's renamed, its macros undefined after it."""
    text = bpf_source(part.bpf_file)
    if clashing:  # one pass for all (one per name was ~40 ms of the default set's ~50)
        names = "|".join(sorted(clashing, key=lambda n: (-len(n), n)))
        text = re.sub(rf"(?<![\w.])(?<!->)(?:{names})\b", rf"{part.prefix}__\g<0>", text)
    defines = [f"#define {f[2:].replace('=', ' ', 1)}" for f in part.cflags if f.startswith("-D")]
    # Its own macros, not gpujitter.h's, which every part uses.
    flagged = {m.group() for f in part.cflags if f.startswith("-D") and (m := _NAME.match(f[2:]))}
    macros = set(_DEFINE.findall(part.bpf_file.read_text())) | flagged
    p = part.prefix
    head = [
        *defines,
        f"#define GJ_THIS_PART {part_id}",
        "#undef TRACEPOINT_PROBE",
        "#define TRACEPOINT_PROBE(category, event) int "
        f"{p}{_TP_PREFIX}##category##__##event(struct tracepoint__##category##__##event *args)",
        "#undef RAW_TRACEPOINT_PROBE",
        "#define RAW_TRACEPOINT_PROBE(event) int "
        f"{p}{_RAW_PREFIX}##event(struct bpf_raw_tracepoint_args *ctx)",
        f'#line 1 "{part.bpf_file}"',
    ]
    tail = [f"#undef {m}" for m in sorted(macros | {"GJ_THIS_PART"})]
    return "\n".join([*head, text, *tail]) + "\n"


def bundle_text(parts: Sequence[ModulePart]) -> tuple[str, dict[str, set[str]]]:
    """The module's C text, and for each part the names renamed in it."""
    seen: dict[str, int] = {}
    own = {p.name: defined_names(_own_text(p)) for p in parts}
    for names in own.values():
        for n in names:
            seen[n] = seen.get(n, 0) + 1
    clashing = {p.name: {n for n in own[p.name] if seen[n] > 1} for p in parts}
    present = "".join(f"#define GJ_PART_{p.prefix.upper()} 1\n" for p in parts)
    text = "".join(part_text(p, clashing[p.name], i) for i, p in enumerate(parts, start=1))
    return present + text, clashing


def _own_text(part: ModulePart) -> str:
    """The part's file with the per-probe half of gpujitter.h (after its include guard),
    which every part defines: the shared half is defined once, by the first part."""
    header = (BPF_DIR / SHARED_HEADER).read_text()
    return part.bpf_file.read_text() + header.split("#endif /* GPUJITTER_H */", 1)[-1]


def module_cflags(parts: Sequence[ModulePart]) -> list[str]:
    """The compiler options of a module of `parts`: theirs but the -D options, which
    part_text confines to each part; COMPILE_FLAGS last."""
    own = sorted({f for p in parts for f in p.cflags if not f.startswith("-D")})
    return [*own, *COMPILE_FLAGS]


def compile_module(text: str, cflags: list[str]) -> tuple[Any, str]:
    """bcc's module of `text`, or None and the first line of why not. bcc's own import
    failing (a node without it) raises."""
    from bcc import BPF  # imported here: the registry must load on nodes without bcc

    if (why := compile_blocked()) is not None:
        return None, why
    with captured_output() as err:
        try:
            return BPF(text=text.encode(), cflags=cflags), ""
        except Exception as exc:
            return None, first_error_line(err(), str(exc))


@dataclass(slots=True)
class _Ahead:
    """A compile started before the Bundle that takes it (compile_ahead), and its result."""

    parts: tuple[ModulePart, ...]
    text: str
    renamed: dict[str, set[str]]
    thread: threading.Thread | None = None
    bpf: Any = None
    error: str | None = None  # its first error line, "" for none; None: no result

    def run(self) -> None:
        try:
            self.bpf, self.error = compile_module(self.text, module_cflags(self.parts))
        except Exception:  # bcc missing, say: raised again by the Bundle's own compile
            self.bpf, self.error = None, None


_ahead: _Ahead | None = None
_ahead_lock = threading.Lock()


def compile_ahead(parts: Sequence[ModulePart]) -> None:
    """Start compiling the module of `parts` on a thread of its own: libbcc compiles without
    the GIL, so the seconds of the compile overlap what the process does before it needs
    the module (`gpujitter run`: importing and building the daemon); the
    first Bundle of the same parts takes the result, its error included, instead of
    compiling. The module's text is made here, from the parts' files as they are now;
    the thread has only the compile's Python around the C to run. One at a time: a call
    while one is pending does nothing."""
    global _ahead
    with _ahead_lock:
        if _ahead is not None or not parts:
            return
        ahead = _ahead = _Ahead(tuple(parts), *bundle_text(parts))
        ahead.thread = threading.Thread(target=ahead.run, name="gpujitter-compile", daemon=True)
        ahead.thread.start()


def _take_ahead() -> _Ahead | None:
    """The pending compile_ahead, once it has finished."""
    global _ahead
    with _ahead_lock:
        ahead, _ahead = _ahead, None
    if ahead is not None and ahead.thread is not None:
        ahead.thread.join()
    return ahead


def finish_ahead() -> bool:
    """Wait for a pending compile_ahead to finish (the Bundle that takes it still does);
    whether one was pending."""
    with _ahead_lock:
        ahead = _ahead
    if ahead is None or ahead.thread is None:
        return False
    ahead.thread.join()
    return True


def _drop_ahead() -> None:
    """At exit, a compile that no Bundle took (the start failed meanwhile): waited for and
    freed before the interpreter goes, as a thread still in LLVM while the process tears
    the library down can crash it."""
    ahead = _take_ahead()
    if ahead is not None and ahead.bpf is not None:
        ahead.bpf.cleanup()


atexit.register(_drop_ahead)


class Bundle:
    """The compiled module, shared by the views of its parts; freed when its creator and
    every view have released it."""

    def __init__(self, parts: Sequence[ModulePart]) -> None:
        self.parts = {p.name: p for p in parts}
        self.failed: dict[str, str] = {}  # part -> why it was left out of the module
        self.bpf: Any = None
        self.renamed: dict[str, set[str]] = {}
        self.ids: dict[str, int] = {}  # part -> GJ_THIS_PART in the compiled module
        self.views: dict[str, PartView] = {}  # the parts taken and not yet cleaned up
        self._holds = 1  # the creator's, given back with release() once the parts took theirs
        self._lock = threading.Lock()
        self._compile()

    def _compile(self) -> None:
        todo = list(self.parts.values())
        ahead = _take_ahead()
        if ahead is not None and ahead.parts != tuple(todo) and ahead.bpf is not None:
            ahead.bpf.cleanup()  # of other parts: nobody's
        while todo:
            self.ids = {p.name: i for i, p in enumerate(todo, start=1)}
            if ahead is not None and ahead.parts == tuple(todo) and ahead.error is not None:
                # The same parts, so the same text and options: compiled already.
                self.bpf, line, self.renamed = ahead.bpf, ahead.error, ahead.renamed
            else:
                text, self.renamed = bundle_text(todo)
                self.bpf, line = compile_module(text, module_cflags(todo))
            ahead = None
            if self.bpf is not None:
                return
            culprit = next((p for p in todo if str(p.bpf_file) in line), None)
            essential = [p for p in todo if p.essential]
            if culprit is not None and not culprit.essential and len(todo) > 1:
                self.failed[culprit.name] = f"{line} (compiled without it: the others run)"
                todo.remove(culprit)
            elif culprit is None and essential and len(essential) < len(todo):
                # An error that names no file (a map the kernel refused): the essential parts are
                # compiled alone, so that what the others lack does not take them down too.
                for p in todo:
                    if not p.essential:
                        self.failed[p.name] = line
                todo = essential
            else:
                for p in todo:
                    self.failed[p.name] = line
                return

    def view(self, name: str) -> PartView:
        if name not in self.parts:
            raise KeyError(name)
        if name in self.failed:
            raise ProbeUnavailable(self.failed[name])
        with self._lock:
            self._holds += 1
            view = self.views[name] = PartView(self, name)
        return view

    def carrier(self, name: str, events: Sequence[str]) -> int:
        """The number (GJ_THIS_PART) of part `name` where its programs on the raw
        tracepoints `events` are attached in this module, 0 where they are not."""
        view = self.views.get(name)
        if view is None or not all(e in view.raw_tracepoint_fds for e in events):
            return 0
        return self.ids[name]

    def release(self) -> None:
        """Give back a hold (a view's, or the creator's); the last one frees the module."""
        with self._lock:
            self._holds -= 1
            last = self._holds == 0
        if last and self.bpf is not None:
            self.bpf.cleanup()
            self.bpf = None


def load_part(
    ctx: ProbeContext,
    part: ModulePart,
    attach: Callable[[PartView], None],
    skip: Callable[[Bundle], frozenset[str]] = lambda bundle: frozenset(),
) -> PartView:
    """`part` from the set's module (compiled alone where the set has none, or not with it),
    its tracepoints attached but those `skip` names for its module (raw tracepoints whose
    work another part's program runs there), then `attach(view)` for the hooks the probe
    attaches itself. A failure raises ProbeUnavailable with its first error line and
    detaches what was."""
    if ctx.bundle is not None and ctx.bundle.parts.get(part.name) == part:
        view = ctx.bundle.view(part.name)
    else:  # not in the set's module, or with other options now
        alone = Bundle([part])
        try:
            view = alone.view(part.name)
        finally:
            alone.release()
    with captured_output() as err:
        try:
            view.attach_hooks(skip(view.bundle))
            attach(view)
        except Exception as exc:
            view.cleanup()
            raise ProbeUnavailable(first_error_line(err(), str(exc))) from None
    return view


def hook_of(function: str) -> tuple[str, str] | None:
    """The hook a module's program runs on, from its name (the probe macros above make
    PART__raw_tracepoint__EVENT and PART__tracepoint__CATEGORY__EVENT): ("raw", EVENT) or
    ("tp", "CATEGORY:EVENT"); None for any other program (perf events, uprobes)."""
    _, raw, event = function.partition(_RAW_PREFIX)
    if raw:
        return "raw", event
    _, tracepoint, rest = function.partition(_TP_PREFIX)
    if tracepoint:
        category, _, event = rest.partition("__")
        return "tp", f"{category}:{event}"
    return None


def _file_name_bytes(kwargs: dict[str, Any]) -> dict[str, Any]:
    """A uprobe's `name=` as bytes: bcc encodes a str strictly, and a mapped file's name need
    not be UTF-8 (the probes read /proc/PID/maps with os.fsdecode: its surrogates stand for
    those bytes). Attach and detach encode alike, so bcc names the event the same. Its
    `sym=` too: bcc takes names as bytes (a str is a DeprecationWarning, an error under
    PYTHONWARNINGS=error, which made a probe unavailable)."""
    name, sym = kwargs.get("name"), kwargs.get("sym")
    if isinstance(name, str):
        kwargs = {**kwargs, "name": os.fsencode(name)}
    return {**kwargs, "sym": sym.encode()} if isinstance(sym, str) else kwargs


@dataclass(slots=True)
class PartView:
    """The bcc module as one part sees it: its maps and programs under the names of its
    source, and the hooks it attached, which it alone detaches."""

    bundle: Bundle
    name: str
    funcs: dict[bytes, Any] = field(default_factory=dict)  # programs it loaded (cost, stats)
    tracepoint_fds: dict[str, int] = field(default_factory=dict)
    raw_tracepoint_fds: dict[str, int] = field(default_factory=dict)
    # A program attached with cookies: its (real) name -> the raw tracepoints it is on, which
    # its name does not tell (hook_of).
    shared_hooks: dict[str, list[str]] = field(default_factory=dict)
    uprobes: list[bytes] = field(default_factory=list)  # bcc's event names
    perf_events: list[tuple[int, int]] = field(default_factory=list)

    @property
    def bpf(self) -> Any:
        return self.bundle.bpf

    @property
    def prefix(self) -> str:
        return self.bundle.parts[self.name].prefix

    def real(self, name: str | bytes) -> str:
        """The module's name for what the part's source calls `name`."""
        text = name.decode() if isinstance(name, bytes) else name
        if text in self.bundle.renamed[self.name] or text.startswith(_HOOK_NAMES):
            return f"{self.prefix}__{text}"
        return text

    # bcc takes names as bytes (_file_name_bytes says why).
    def __getitem__(self, name: str) -> Any:
        return self.bpf[self.real(name).encode()]

    def load_func(self, fn_name: str | bytes, prog_type: int, **kwargs: Any) -> Any:
        fn = self.bpf.load_func(self.real(fn_name).encode(), prog_type, **kwargs)
        self.funcs[fn.name] = fn
        return fn

    def attach_tracepoint(self, *, tp: str, fn_name: str | bytes) -> None:
        from bcc import BPF
        from bcc.libbcc import lib

        category, _, event = tp.partition(":")
        fn = self.load_func(fn_name, BPF.TRACEPOINT)
        fd = lib.bpf_attach_tracepoint(fn.fd, category.encode(), event.encode())
        if fd < 0:
            raise ProbeUnavailable(f"cannot attach tracepoint {tp}")
        self.tracepoint_fds[tp] = fd

    def attach_hooks(self, skip: frozenset[str] = frozenset()) -> None:
        """Attach the part's tracepoint programs (what bcc does by itself for a module of
        one source), but those on the raw tracepoints in `skip`."""
        from bcc.libbcc import lib

        for i in range(int(lib.bpf_num_functions(self.bpf.module))):
            name = lib.bpf_function_name(self.bpf.module, i).decode()
            hook = hook_of(name) if name.startswith(f"{self.prefix}__") else None
            if hook and hook[0] == "tp":
                self.attach_tracepoint(tp=hook[1], fn_name=name)
            elif hook and hook[1] not in skip:
                self.attach_raw_tracepoint(tp=hook[1], fn_name=name)

    def attach_raw_tracepoint(
        self, *, tp: str | bytes, fn_name: str | bytes, cookie: int | None = None
    ) -> None:
        """Attach fn_name on the raw tracepoint `tp`; with a cookie (probes/tp_cookie.py), one
        program may serve several hooks and read which one ran."""
        from bcc import BPF
        from bcc.libbcc import lib

        event = tp.decode() if isinstance(tp, bytes) else tp
        fn = self.load_func(fn_name, BPF.RAW_TRACEPOINT)
        if cookie is None:
            fd = lib.bpf_attach_raw_tracepoint(fn.fd, event.encode())
        else:
            try:
                fd = tp_cookie.attach(fn.fd, event, cookie)
            except OSError as err:
                raise ProbeUnavailable(f"cannot attach raw tracepoint {event}: {err}") from None
            self.shared_hooks.setdefault(fn.name.decode(), []).append(event)
        if fd < 0:
            raise ProbeUnavailable(f"cannot attach raw tracepoint {event}")
        self.raw_tracepoint_fds[event] = fd

    def detach_raw_tracepoint(self, *, tp: str | bytes) -> None:
        event = tp.decode() if isinstance(tp, bytes) else tp
        os.close(self.raw_tracepoint_fds.pop(event))
        for events in self.shared_hooks.values():
            if event in events:
                events.remove(event)

    def detach_tracepoint(self, tp: str) -> None:
        from bcc.libbcc import lib

        lib.bpf_close_perf_event_fd(self.tracepoint_fds.pop(tp))

    def attach_perf_event(self, *, fn_name: str, **kwargs: Any) -> None:
        before = set(self.bpf.open_perf_events)
        self.bpf.attach_perf_event(fn_name=self.real(fn_name).encode(), **kwargs)
        self.perf_events += sorted(set(self.bpf.open_perf_events) - before)
        self._keep_loaded(fn_name)

    def detach_perf_event(self, *, ev_type: int, ev_config: int) -> None:
        self.bpf.detach_perf_event(ev_type=ev_type, ev_config=ev_config)
        self.perf_events.remove((ev_type, ev_config))

    def attach_uprobe(self, *, fn_name: str, **kwargs: Any) -> None:
        kwargs = _file_name_bytes(kwargs)
        fn = self.real(fn_name).encode()
        self._with_uprobes(lambda: self.bpf.attach_uprobe(fn_name=fn, **kwargs))
        self._keep_loaded(fn_name)

    def attach_uretprobe(self, *, fn_name: str, **kwargs: Any) -> None:
        kwargs = _file_name_bytes(kwargs)
        fn = self.real(fn_name).encode()
        self._with_uprobes(lambda: self.bpf.attach_uretprobe(fn_name=fn, **kwargs))
        self._keep_loaded(fn_name)

    def detach_uprobe(self, **kwargs: Any) -> None:
        kwargs = _file_name_bytes(kwargs)
        self._without_uprobes(lambda: self.bpf.detach_uprobe(**kwargs))

    def detach_uretprobe(self, **kwargs: Any) -> None:
        kwargs = _file_name_bytes(kwargs)
        self._without_uprobes(lambda: self.bpf.detach_uretprobe(**kwargs))

    def _without_uprobes(self, detach: Callable[[], None]) -> None:
        before = set(self.bpf.uprobe_fds)
        detach()
        gone = before - set(self.bpf.uprobe_fds)
        self.uprobes = [u for u in self.uprobes if u not in gone]

    def _with_uprobes(self, attach: Callable[[], None]) -> None:
        before = set(self.bpf.uprobe_fds)
        attach()
        self.uprobes += sorted(set(self.bpf.uprobe_fds) - before)

    def _keep_loaded(self, fn_name: str) -> None:
        fn = self.bpf.funcs.get(self.real(fn_name).encode())
        if fn is not None:
            self.funcs[fn.name] = fn

    def ring_buffer_consume(self) -> None:
        consume_rings(self.bpf)

    def cleanup(self) -> None:
        """Detach what this part attached; the module goes with the last part's view."""
        self.detach()
        self.funcs.clear()
        if self.bundle.views.get(self.name) is self:
            del self.bundle.views[self.name]
        self.bundle.release()

    def detach(self) -> None:
        """Detach what this part attached; its programs and maps stay loaded (attach_hooks
        attaches its tracepoints again). The tracepoints side by side: each waits for the
        kernel's grace periods, and malloc's ten took 1.3 s one after another here, 0.4 s
        at once."""
        from bcc.libbcc import lib

        if self.bpf is not None:
            closers = []
            for fd in self.tracepoint_fds.values():
                t = threading.Thread(target=lib.bpf_close_perf_event_fd, args=(fd,))
                try:
                    t.start()
                except RuntimeError:  # no thread to be had (ulimit -v, TasksMax): in turn
                    lib.bpf_close_perf_event_fd(fd)
                    continue
                closers.append(t)
            for t in closers:
                t.join()
            self.tracepoint_fds.clear()
            for fd in self.raw_tracepoint_fds.values():
                os.close(fd)
            self.raw_tracepoint_fds.clear()
            self.shared_hooks.clear()
            for ev_name in self.uprobes:
                self.bpf.detach_uprobe_event(ev_name)
            self.uprobes.clear()
            for ev_type, ev_config in self.perf_events:
                self.bpf.detach_perf_event(ev_type, ev_config)
            self.perf_events.clear()
