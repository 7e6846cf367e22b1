"""OmegaConf's YAML output (``OmegaConf.to_yaml``: PyYAML's pure-Python emitter, width 80, OmegaConf's
representation of text) of a sweep job's ``.hydra/`` files, made from a template per document for many jobs.
``tests/test_fast_path.py`` checks the files byte for byte against Hydra's ``run_job``'s."""

from __future__ import annotations

import enum
import io
import typing as tp

import yaml

#: YAML 1.1's words for booleans, which OmegaConf quotes when they are text (``omegaconf``'s dumper).
_YAML_BOOLS = frozenset("y Y yes Yes YES n N no No NO true True TRUE false False FALSE on On ON off Off OFF".split())  # noqa: SIM905


class _OmegaConfDumper(yaml.Dumper):
    """PyYAML's dumper with OmegaConf's representation of text: quoted when it reads as a boolean (YAML 1.1) or
    as a number to Python's ``int``/``float`` (OmegaConf's ``to_yaml``); an enum member as its name."""


def _represent_str(dumper: yaml.Dumper, data: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style="'" if _reads_as_other(data) else None)


def _reads_as_other(text: str) -> bool:
    if text in _YAML_BOOLS:
        return True
    for kind in (int, float):
        try:
            kind(text)
            return True
        except ValueError:
            pass
    return False


_OmegaConfDumper.add_representer(str, _represent_str)
_OmegaConfDumper.add_multi_representer(enum.Enum, lambda dumper, data: _represent_str(dumper, data.name))


def to_yaml(container: tp.Any) -> str:
    """``OmegaConf.to_yaml`` of the config ``container`` is (``OmegaConf.to_container(cfg, resolve=False)``)."""
    return tp.cast(str, yaml.dump(container, Dumper=_OmegaConfDumper, default_flow_style=False, allow_unicode=True,
                                  sort_keys=False))


class YamlDoc:
    """:func:`to_yaml` of one document again and again with a few values changed, without emitting it every time.

    The document is represented once (PyYAML's node tree). For each set of changed key paths, it is emitted once
    with a marker in place of each changed value (a template); :meth:`text` then writes each changed value into
    its place as the emitter writes it there. What PyYAML's emitter writes for a mapping's value depends on the
    value and on where it is written: the column after its key's ``:`` (where a line longer than the width
    breaks, in ``write_plain``/``write_double_quoted``/``write_single_quoted``) and the indentation of its
    mapping (that of a continuation line, a block sequence's items, a nested mapping's keys); the emitter's state
    after the ``:`` is the same for every value. So each value is emitted on its own with the same keys above it
    (:meth:`_placed`: the same column and indentation), and what follows its key's ``:`` there is what the whole
    document has there, wrapped lines and block collections included. A value whose own text could depend on the
    rest of the document (an anchor, an explicit document end) or a marker that is not a mapping's value is
    emitted in full instead. Either way the text is what :func:`to_yaml` gives for the changed data."""

    def __init__(self, data: dict[str, tp.Any]) -> None:
        self._dumper = _OmegaConfDumper(io.StringIO(), default_flow_style=False, allow_unicode=True, sort_keys=False)
        self.root = self._represent(data)
        self._templates: dict[tuple[tuple[str, ...], ...], _Template | None] = {}
        self._heads: dict[tuple[str, ...], str | None] = {}
        # placed scalars and one-item lists: a sweep's jobs set the same few values again and again
        self._scalars: dict[tuple[tuple[str, ...], type, str], str | None] = {}

    def _represent(self, value: tp.Any) -> yaml.Node:
        node = self._dumper.represent_data(value)
        self._dumper.represented_objects, self._dumper.object_keeper, self._dumper.alias_key = {}, [], None
        return tp.cast(yaml.Node, node)

    def text(self, changes: tp.Mapping[tuple[str, ...], tp.Any]) -> str:
        """The document with ``changes`` (``{key path: new value}``, paths through mappings only) applied."""
        paths = tuple(changes)
        if paths not in self._templates:
            self._templates[paths] = self._template(paths)
        template = self._templates[paths]
        if template is not None:
            filled = template.fill([self._placed(p, changes[p]) for p in paths])
            if filled is not None:
                return filled
        return _emit(self._replace(self.root, {p: self._represent(v) for p, v in changes.items()}, ()))

    def _template(self, paths: tuple[tuple[str, ...], ...]) -> _Template | None:
        marks = [f"{_MARK}{i}X" for i in range(len(paths))]
        text = _emit(self._replace(self.root, {p: yaml.ScalarNode("tag:yaml.org,2002:str", m)
                                               for p, m in zip(paths, marks)}, ()))
        if any(text.count(m) != 1 for m in marks):
            return None
        return _Template(text, marks)

    def _placed(self, path: tuple[str, ...], value: tp.Any) -> str | None:
        """What the emitter writes after the ``:`` of the key at ``path`` when that key's value is ``value``
        (``" 3"``, a plain scalar wrapped over lines, ``"\\n- a\\n- b"`` for a list), without the line break
        that ends it; None when it cannot be told from ``path`` alone (see the class docstring)."""
        head = self._heads.get(path, _UNSET)
        if head is _UNSET:
            marked = _emit(self._nested(path, yaml.ScalarNode("tag:yaml.org,2002:str", _MARK)))
            at = marked.find(_MARK)
            head = self._heads[path] = marked[:at - 1] if marked[at - 2:at] == ": " else None
        if head is None:
            return None
        scalar = value is None or isinstance(value, (str, int, float))
        if isinstance(value, list) and value and all(v is None or isinstance(v, (str, int, float)) for v in value):
            # a block sequence of scalars: each item is its own "- item" line (the emitter's state after one is
            # that after any other), so where every item is one line, the list is its items' lines
            items = [self._placed(path, [v]) if len(value) > 1 else None for v in value]
            if all(i is not None and i.count("\n") == 1 and i.startswith("\n") for i in items):
                return "".join(tp.cast(list[str], items))
        key = (path, type(value), repr(value))
        cache = scalar or (isinstance(value, list) and len(value) == 1)
        if cache and key in self._scalars:
            return self._scalars[key]
        text = _emit(self._nested(path, self._represent(value)))
        body: str | None = text[len(head):-1]
        if not text.startswith(head) or not text.endswith("\n") or text.endswith("\n...\n") or "&id" in text:
            body = None  # (an anchor's number, an explicit document end: the whole document decides those)
        if cache and len(self._scalars) < _MAX_SCALARS:
            self._scalars[key] = body
        return body

    def _nested(self, path: tuple[str, ...], node: yaml.Node) -> yaml.Node:
        """``node`` as the value at ``path`` in a document of nothing but the mappings on that path."""
        for key in reversed(path):
            node = yaml.MappingNode("tag:yaml.org,2002:map", [(self._represent(key), node)], flow_style=False)
        return node

    def _replace(self, node: yaml.Node, changes: tp.Mapping[tuple[str, ...], yaml.Node], path: tuple[str, ...]
                 ) -> yaml.Node:
        if path in changes:
            return changes[path]
        depth = len(path)
        below = {p[depth] for p in changes if len(p) > depth and p[:depth] == path}
        if not below:
            return node
        assert isinstance(node, yaml.MappingNode)
        pairs, seen = [], set()
        for key, value in node.value:
            if key.value in below:
                value = self._replace(value, changes, (*path, key.value))
                seen.add(key.value)
            pairs.append((key, value))
        for name in sorted(below - seen):  # a new key goes last, as an assignment adds it
            empty = yaml.MappingNode("tag:yaml.org,2002:map", [], flow_style=False)
            pairs.append((self._represent(name), self._replace(empty, changes, (*path, name))))
        return yaml.MappingNode(node.tag, pairs, flow_style=node.flow_style)


#: A plain scalar no config value is: marks where a changed value goes in a template.
_MARK = "AMHMARK"
_UNSET: tp.Any = object()
#: How many placed values (a scalar, a one-item list) a document keeps.
_MAX_SCALARS = 4096


def _emit(node: yaml.Node) -> str:
    return tp.cast(str, yaml.serialize(node, Dumper=_OmegaConfDumper, allow_unicode=True))


class _Template:
    """A document's text with a marker where each changed value goes, each as a mapping's value (``key: MARK``)."""

    def __init__(self, text: str, marks: list[str]) -> None:
        where = sorted((text.index(m), i, m) for i, m in enumerate(marks))
        self.parts: list[str] = []  # text before each marker, in the document's order, then the rest
        self.order: list[int] = []  # which change each marker is
        self.valued: list[bool] = []  # whether the marker is a mapping's value (``key: MARK``)
        pos = 0
        for at, i, m in where:
            before = text[pos:at]
            line = text[text.rfind("\n", 0, at) + 1:at]
            self.parts.append(before)
            self.order.append(i)
            self.valued.append(line.endswith(": "))
            pos = at + len(m)
        self.parts.append(text[pos:])

    def fill(self, placed: list[str | None]) -> str | None:
        """The text with ``placed[i]`` (:meth:`YamlDoc._placed`: what follows the key's ``:``) in place of
        marker ``i`` and the space before it; None where one cannot be placed."""
        out = []
        for k, i in enumerate(self.order):
            value = placed[i]
            if value is None or not self.valued[k]:
                return None
            out.append(self.parts[k][:-1] + value)
        out.append(self.parts[-1])
        return "".join(out)
