"""Read a search-space file with bounds, so no file can hang, exhaust or crash the loader.

A space file is a few kilobytes of hand-written YAML, but the loader must survive anything
(a wrong file passed by mistake, a generated one gone wrong): a 50 MB file, a binary or
UTF-16 file, ten thousand nested brackets, an integer with 5000 digits, or an alias bomb
(a few lines whose aliases expand to billions of values). Each is refused with a
:class:`~parsearch.errors.SpaceError` naming the file, and the line where YAML tells it:

* at most :data:`MAX_FILE_BYTES`, read as UTF-8 (a byte-order mark is allowed);
* nesting at most :data:`MAX_DEPTH` deep, checked while composing (before recursion);
* at most :data:`MAX_EXPANDED_VALUES` values once every alias is expanded, counted on the
  composed graph without expanding it; an alias that contains itself is refused;
* integers of at most :data:`MAX_INT_DIGITS` digits (Python refuses 4300+ with a bare
  ``ValueError``); duplicate keys in a mapping (YAML says "last wins"; a typo'd copy would
  silently override the first).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from parsearch.errors import SpaceError

MAX_FILE_BYTES = 1 << 20
MAX_DEPTH = 32
MAX_EXPANDED_VALUES = 100_000
MAX_INT_DIGITS = 30
_MERGE_TAG = "tag:yaml.org,2002:merge"


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader with the bounds above."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise ConstructorError(
                    None,
                    None,
                    f"nested more than {MAX_DEPTH} levels deep",
                    self.peek_event().start_mark,
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def get_single_node(self) -> Node | None:
        node = super().get_single_node()
        if node is not None:
            _count_expanded(node)
        return node

    def construct_mapping(self, node: Node, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, MappingNode):
            first_line: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == _MERGE_TAG:
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    seen = first_line.get(key)
                except TypeError:  # an unhashable key: the base class says so
                    break
                if seen is not None:
                    raise ConstructorError(
                        None,
                        None,
                        f"duplicate key {key!r} (first at line {seen + 1}); keep one",
                        key_node.start_mark,
                    )
                first_line[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def _bounded_int(loader: _BoundedLoader, node: Node) -> int:
    text = str(node.value).replace("_", "").lstrip("+-")
    if len(text) > MAX_INT_DIGITS:
        raise ConstructorError(
            None,
            None,
            f"an integer of {len(text)} digits (at most {MAX_INT_DIGITS})",
            node.start_mark,
        )
    return loader.construct_yaml_int(node)


_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _bounded_int)


def _count_expanded(root: Node) -> None:
    """Refuse a document whose aliases expand past :data:`MAX_EXPANDED_VALUES` values.

    The composed graph shares a node for every use of an anchor, so the expanded size is
    summed over it once per distinct node (memoised), never by expanding it.
    """
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(node: Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in open_nodes:
            raise ConstructorError(None, None, "an alias refers to itself", node.start_mark)
        open_nodes.add(key)
        total = 1
        if isinstance(node, SequenceNode):
            total += sum(size(child) for child in node.value)
        elif isinstance(node, MappingNode):
            total += sum(size(k) + size(v) for k, v in node.value)
        elif isinstance(node, ScalarNode):
            total += len(node.value) // 1000  # long strings count by their length too
        open_nodes.discard(key)
        if total > MAX_EXPANDED_VALUES:
            raise ConstructorError(
                None,
                None,
                f"expands to more than {MAX_EXPANDED_VALUES} values through aliases "
                "(a space file needs a few hundred)",
                node.start_mark,
            )
        sizes[key] = total
        return total

    size(root)


def _decode(data: bytes, source: str) -> str:
    if data.startswith((b"\xff\xfe", b"\xfe\xff")) or b"\x00" in data[:4]:
        raise SpaceError("is UTF-16 or UTF-32 text; save it as UTF-8", source=source)
    if b"\x00" in data:
        raise SpaceError("holds NUL bytes: it is a binary file, not YAML", source=source)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise SpaceError(
            f"is not UTF-8 text: byte 0x{data[error.start]:02X} at line {line} (Latin-1 or "
            "another encoding?); save it as UTF-8",
            source=source,
        ) from None


def file_kind(mode: int) -> str | None:
    """What a file that is not a regular one is (``None`` for a regular file)."""
    kinds = {
        stat.S_ISDIR: "a directory",
        stat.S_ISFIFO: "a named pipe (FIFO)",
        stat.S_ISCHR: "a character device",
        stat.S_ISBLK: "a block device",
        stat.S_ISSOCK: "a socket",
    }
    if stat.S_ISREG(mode):
        return None
    return next((kind for test, kind in kinds.items() if test(mode)), "not a regular file")


def read_document(path: Path) -> Any:
    """The YAML document in ``path``, read within the bounds above."""
    source = str(path)
    try:
        # Non-blocking: opening a FIFO with no writer must not wait for one.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
        with os.fdopen(fd, "rb") as file:
            kind = file_kind(os.fstat(fd).st_mode)
            if kind is not None:
                raise SpaceError(f"is {kind}, not a space file (a regular file)", source=source)
            data = file.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise SpaceError("file not found", source=source) from None
    except IsADirectoryError:
        raise SpaceError("is a directory, not a space file", source=source) from None
    except OSError as error:
        raise SpaceError(f"cannot read: {error.strerror}", source=source) from None
    if len(data) > MAX_FILE_BYTES:
        raise SpaceError(
            f"is larger than {MAX_FILE_BYTES // 1024} KiB; a space file is a few KiB of YAML",
            source=source,
        )
    text = _decode(data, source)
    try:
        return yaml.load(text, Loader=_BoundedLoader)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(error, "problem", None) or str(error)
        raise SpaceError(f"not valid YAML{where}: {problem}", source=source) from None
    except RecursionError:
        raise SpaceError(f"nested more than {MAX_DEPTH} levels deep", source=source) from None
