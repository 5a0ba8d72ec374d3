"""The file-system sandbox: a fresh temporary directory per episode, and four tools
confined to it — `list_dir`, `read_file`, `write_file`, `search`.

Every path the model gives is relative to the sandbox root. The sandbox refuses, with a
tool error the model reads:

- absolute paths and any `..` component (no walking out by name);
- paths that resolve outside the root through a symlink, and writes to a symlink;
- writes over `max_write_bytes`, a sandbox over `max_total_bytes`, `max_files` or
  `max_folders`, and paths more than `max_depth` folders deep;
- more than `max_calls` tool calls in one episode (a runaway loop).

The grader reads the files the episode leaves (`FileSandbox.snapshot`). `FileTasks`,
registered as "files", is a task family built on it: copy, rename and write tasks that
need one to three tool calls, split into training and held-out tasks.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from training.environments.base import Environment, Grade, Task, ToolError, register


def _function(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


_PATH = {"type": "string", "description": "a path relative to the working folder"}
FILE_TOOLS: list[dict[str, Any]] = [
    _function("list_dir", "List the files in a folder.", {"path": _PATH}, []),
    _function("read_file", "Read a text file.", {"path": _PATH}, ["path"]),
    _function(
        "write_file",
        "Write a text file (replacing it if it exists).",
        {"path": _PATH, "content": {"type": "string"}},
        ["path", "content"],
    ),
    _function(
        "search",
        "Find the lines that contain a text, in every file under a folder.",
        {"query": {"type": "string"}, "path": _PATH},
        ["query"],
    ),
]


@dataclass
class FileSandbox:
    """One episode's folder and its counters. Create with `FileSandbox.create`."""

    root: Path
    max_write_bytes: int = 16_384
    max_total_bytes: int = 262_144
    max_files: int = 64
    max_calls: int = 32
    max_read_bytes: int = 16_384
    max_search_files: int = 200
    max_folders: int = 32
    max_depth: int = 8
    calls: int = 0
    meta: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def create(cls, files: dict[str, str] | None = None, **limits: Any) -> FileSandbox:
        root = Path(tempfile.mkdtemp(prefix="practicum-files-")).resolve()
        sandbox = cls(root=root, **limits)
        for name, content in (files or {}).items():
            path = sandbox.resolve(name, for_write=True)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content, encoding="utf-8")
        return sandbox

    def remove(self) -> None:
        """Delete the folder, whatever the episode left in it. Never raises: a tree too deep
        for a recursive delete is taken apart from the bottom without recursion."""
        try:
            shutil.rmtree(self.root)
        except FileNotFoundError:
            return
        except (OSError, RecursionError):
            _remove_tree(self.root)

    # --- confinement -----------------------------------------------------------------

    def resolve(self, path: Any, *, for_write: bool = False) -> Path:
        """The real path of `path` inside the root, or ToolError. Symlinks are followed
        only to check where they lead; a write never goes through one."""
        if not isinstance(path, str):
            raise ToolError("path must be a string")
        text = path.strip() or "."
        if "\x00" in text:
            raise ToolError("path contains a NUL character")
        pure = PurePosixPath(text.replace("\\", "/"))
        if pure.is_absolute() or (len(text) > 1 and text[1] == ":"):
            raise ToolError(f"{path!r} is an absolute path; use a path relative to the working folder")
        if ".." in pure.parts:
            raise ToolError(f"{path!r} leaves the working folder ('..' is not allowed)")
        if len(pure.parts) > self.max_depth:
            raise ToolError(f"{path[:80]!r} is too deep: at most {self.max_depth} levels of folders")
        candidate = self.root.joinpath(*pure.parts) if pure.parts else self.root
        real = Path(os.path.realpath(candidate))
        if real != self.root and self.root not in real.parents:
            raise ToolError(f"{path!r} leads outside the working folder (through a symbolic link)")
        if for_write and candidate.is_symlink():
            raise ToolError(f"{path!r} is a symbolic link; write to a regular file")
        return real

    def _tick(self) -> None:
        self.calls += 1
        if self.calls > self.max_calls:
            raise ToolError(f"too many tool calls in this episode (limit {self.max_calls}); give your answer now")

    def _walk(self, under: Path) -> tuple[list[Path], list[Path]]:
        """(regular files, folders) below `under`, in sorted depth-first order, never
        descending through symbolic links. Iterative: however deep a tree got (a seeded
        one, or one made before these limits), reading it cannot overflow the stack."""
        files: list[Path] = []
        folders: list[Path] = []
        stack = [under]
        while stack:
            folder = stack.pop()
            try:
                entries = sorted(os.scandir(folder), key=lambda e: e.name)
            except OSError:
                continue
            subfolders = []
            for entry in entries:
                if entry.is_symlink():
                    continue
                if entry.is_dir(follow_symlinks=False):
                    subfolders.append(Path(entry.path))
                elif entry.is_file(follow_symlinks=False):
                    files.append(Path(entry.path))
            folders.extend(subfolders)
            stack.extend(reversed(subfolders))
        return files, folders

    def _regular_files(self, under: Path) -> list[Path]:
        """Regular files below `under`, never descending through symbolic links."""
        return self._walk(under)[0]

    # --- tools -----------------------------------------------------------------------

    def list_dir(self, path: str = ".") -> str:
        self._tick()
        folder = self.resolve(path)
        if not folder.is_dir():
            raise ToolError(f"{path!r} is not a folder")
        entries = []
        for child in sorted(folder.iterdir()):
            if child.is_symlink():
                entries.append(f"{child.name} (link)")
            elif child.is_dir():
                entries.append(f"{child.name}/")
            else:
                entries.append(f"{child.name} ({child.stat().st_size} bytes)")
        return "\n".join(entries) if entries else "(empty)"

    def read_file(self, path: str) -> str:
        self._tick()
        real = self.resolve(path)
        if not real.exists():
            raise ToolError(f"no file named {path!r}")
        if not real.is_file():
            raise ToolError(f"{path!r} is not a file")
        with real.open("rb") as f:
            data = f.read(self.max_read_bytes + 1)
        text = data[: self.max_read_bytes].decode("utf-8", errors="replace")
        if len(data) > self.max_read_bytes:
            text += f"\n… (cut at {self.max_read_bytes} bytes)"
        return text

    def write_file(self, path: str, content: str) -> str:
        self._tick()
        if not isinstance(content, str):
            raise ToolError("content must be a string")
        data = content.encode("utf-8")
        if len(data) > self.max_write_bytes:
            raise ToolError(f"content is {len(data)} bytes; the limit for one write is {self.max_write_bytes}")
        real = self.resolve(path, for_write=True)
        if real == self.root or real.is_dir():
            raise ToolError(f"{path!r} is a folder")
        existing = self._regular_files(self.root)
        if real not in existing and len(existing) >= self.max_files:
            raise ToolError(f"the working folder already holds {self.max_files} files, the limit")
        used = sum(p.stat().st_size for p in existing if p != real)
        if used + len(data) > self.max_total_bytes:
            raise ToolError(f"the working folder would exceed {self.max_total_bytes} bytes")
        missing = 0
        parent = real.parent
        while parent != self.root and not parent.exists():
            missing += 1
            parent = parent.parent
        if missing and len(self._walk(self.root)[1]) + missing > self.max_folders:
            raise ToolError(f"the working folder would hold more than {self.max_folders} folders, the limit")
        real.parent.mkdir(parents=True, exist_ok=True)
        # The parent was checked to be inside the root; O_NOFOLLOW refuses a symlink
        # planted at the last component between the check and the open.
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
        try:
            fd = os.open(real, flags, 0o644)
        except OSError as e:
            raise ToolError(f"cannot write {path!r}: {e.strerror}") from None
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return f"wrote {len(data)} bytes to {self.relative(real)}"

    def search(self, query: str, path: str = ".") -> str:
        self._tick()
        if not isinstance(query, str) or not query:
            raise ToolError("query must be a non-empty string")
        folder = self.resolve(path)
        if not folder.is_dir():
            raise ToolError(f"{path!r} is not a folder")
        hits: list[str] = []
        for p in self._regular_files(folder)[: self.max_search_files]:
            with p.open("rb") as f:
                text = f.read(self.max_read_bytes).decode("utf-8", errors="replace")
            for number, line in enumerate(text.splitlines(), start=1):
                if query.lower() in line.lower():
                    hits.append(f"{self.relative(p)}:{number}: {line[:200]}")
                    if len(hits) >= 50:
                        return "\n".join(hits) + "\n… (first 50 matches)"
        return "\n".join(hits) if hits else f"no line contains {query!r}"

    # --- reading the final state -----------------------------------------------------

    def relative(self, real: Path) -> str:
        return real.relative_to(self.root).as_posix()

    def snapshot(self) -> dict[str, str]:
        """{relative path: content} of every regular file the episode left."""
        out: dict[str, str] = {}
        for p in self._regular_files(self.root):
            if stat.S_ISREG(p.lstat().st_mode):
                out[self.relative(p)] = p.read_bytes()[: self.max_total_bytes].decode("utf-8", errors="replace")
        return out


def _remove_tree(root: Path) -> None:
    """Delete `root` and everything below it without recursion (bottom-up); what cannot be
    deleted is left, silently: cleanup must not end an episode or a training step."""
    folders: list[str] = []
    stack = [str(root)]
    while stack:
        folder = stack.pop()
        folders.append(folder)
        try:
            with os.scandir(folder) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                    else:
                        with contextlib.suppress(OSError):
                            os.unlink(entry.path)
        except OSError:
            continue
    for folder in reversed(folders):
        with contextlib.suppress(OSError):
            os.rmdir(folder)


class FileSandboxEnvironment(Environment):
    """A base for environments on the file-system sandbox: a task's `hidden["files"]`
    seeds the folder, `hidden["expect"]` ({path: content or None for "must not exist"})
    is what the default grader checks. Override `grade` for other checks."""

    tool_methods = ("list_dir", "read_file", "write_file", "search")
    sandbox_limits: dict[str, Any] = {}

    def reset(self, task: Task) -> FileSandbox:
        sandbox = FileSandbox.create(task.hidden.get("files") or {}, **self.sandbox_limits)
        sandbox.meta["expect"] = dict(task.hidden.get("expect") or {})
        return sandbox

    def call(self, state: FileSandbox, name: str, arguments: dict[str, Any]) -> str:
        if name not in self.tool_methods:
            raise ToolError(f"unknown tool {name!r}")
        return getattr(state, name)(**arguments)

    def grade(self, state: FileSandbox, messages: list[dict[str, Any]]) -> Grade:
        return grade_files(state.snapshot(), state.meta.get("expect", {}))

    def close(self, state: FileSandbox) -> None:
        state.remove()


def _same_text(a: str, b: str) -> bool:
    return a.strip() == b.strip()


def grade_files(files: dict[str, str], expect: dict[str, str | None]) -> Grade:
    """Reward = share of expectations met; each is a file that must hold a text (ignoring
    surrounding white space) or, for None, must not exist. Deterministic: it reads only
    the final files."""
    if not expect:
        return Grade(0.0, "the task names no expected files")
    met: list[str] = []
    missed: list[str] = []
    for path, content in sorted(expect.items()):
        if content is None:
            if path in files:
                missed.append(f"{path} should not exist")
            else:
                met.append(f"{path} absent")
        elif path not in files:
            missed.append(f"{path} missing")
        elif _same_text(files[path], content):
            met.append(f"{path} correct")
        else:
            missed.append(f"{path} has the wrong content")
    reward = len(met) / len(expect)
    reason = "; ".join(missed) if missed else "all files correct"
    return Grade(round(reward, 6), reason)


# --- the "files" task family -------------------------------------------------------------

WORDS = (
    "apple river stone cloud maple tiger lemon piano candle rocket violet harbor pepper falcon "
    "meadow silver garden winter copper orange marble forest summer planet"
).split()
HELDOUT_WORDS = WORDS[-8:]  # held-out tasks use words no training task uses
NAMES = "notes todo report draft memo list log plan summary ideas".split()
SYSTEM = ""  # the model's own default system prompt: a custom one cut its tool use to almost none


def _call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": "call_0", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


# One worked example per kind, shown as earlier turns of the conversation.
EXAMPLES: dict[str, tuple[dict[str, Any], ...]] = {
    "write": (
        {"role": "user", "content": "Create a file named example.txt that contains the word hello."},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [_call("write_file", {"path": "example.txt", "content": "hello"})],
        },
        {"role": "tool", "tool_call_id": "call_0", "name": "write_file", "content": "wrote 5 bytes to example.txt"},
        {"role": "assistant", "content": "Done."},
    ),
    "copy": (
        {"role": "user", "content": "Copy the file a.txt to a new file named b.txt."},
        {"role": "assistant", "content": "", "tool_calls": [_call("read_file", {"path": "a.txt"})]},
        {"role": "tool", "tool_call_id": "call_0", "name": "read_file", "content": "hello"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [_call("write_file", {"path": "b.txt", "content": "hello"})],
        },
        {"role": "tool", "tool_call_id": "call_0", "name": "write_file", "content": "wrote 5 bytes to b.txt"},
        {"role": "assistant", "content": "Done."},
    ),
}
TOOLS_BY_KIND = {"write": ("read_file", "write_file"), "copy": ("read_file", "write_file")}


def _write_task(rng: random.Random, words: list[str]) -> tuple[str, dict[str, Any]]:
    name, word = f"{rng.choice(NAMES)}.txt", rng.choice(words)
    prompt = f"Create a file named {name} that contains the word {word}."
    return prompt, {"files": {}, "expect": {name: word}}


def _copy_task(rng: random.Random, words: list[str]) -> tuple[str, dict[str, Any]]:
    source, dest = rng.sample(NAMES, 2)
    word = rng.choice(words)
    prompt = f"Copy the file {source}.txt to a new file named {dest}.txt."
    return prompt, {"files": {f"{source}.txt": word}, "expect": {f"{source}.txt": word, f"{dest}.txt": word}}


KINDS = {"write": _write_task, "copy": _copy_task}


def file_tasks(
    *,
    count: int = 64,
    heldout: int = 16,
    seed: int = 0,
    kinds: tuple[str, ...] = ("write",),
    example: bool = True,
) -> list[Task]:
    """A deterministic family of file tasks: the same arguments give the same tasks.
    The last `heldout` tasks are held out (split "heldout") and use words no training
    task uses. With `example`, each task opens with a worked example of its kind."""
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise ValueError(f"unknown task kinds {unknown}; known: {', '.join(KINDS)}")
    rng = random.Random(seed)
    train_words = [w for w in WORDS if w not in HELDOUT_WORDS]
    tasks: list[Task] = []
    seen: set[str] = set()
    attempts = 0
    while len(tasks) < count and attempts < count * 100:
        attempts += 1
        split = "heldout" if len(tasks) >= count - heldout else "train"
        kind = kinds[len(tasks) % len(kinds)]
        prompt, hidden = KINDS[kind](rng, HELDOUT_WORDS if split == "heldout" else train_words)
        if prompt in seen:
            continue
        seen.add(prompt)
        tools = [t for t in FILE_TOOLS if t["function"]["name"] in TOOLS_BY_KIND[kind]] if example else FILE_TOOLS
        tasks.append(
            Task(
                id=f"{kind}-{len(tasks):03d}",
                prompt=prompt,
                tools=tools,
                hidden=hidden,
                system=SYSTEM if example else "",
                split=split,
                examples=EXAMPLES[kind] if example else (),
            )
        )
    return tasks


@register
class FileTasks(FileSandboxEnvironment):
    """Write and copy tasks in a sandboxed folder, graded on the files left behind."""

    name = "files"
    description = "Create and copy text files in a private folder; graded on the files it leaves."
    max_steps = 4
    max_tokens = 192

    def __init__(
        self,
        *,
        count: int = 64,
        heldout: int = 16,
        seed: int = 0,
        kinds: tuple[str, ...] | list[str] = ("write",),
        example: bool = True,
    ):
        self._tasks = file_tasks(count=count, heldout=heldout, seed=seed, kinds=tuple(kinds), example=example)

    def tasks(self) -> list[Task]:
        return list(self._tasks)
