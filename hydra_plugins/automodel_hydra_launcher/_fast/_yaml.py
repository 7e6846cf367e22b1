"""OmegaConf's YAML output (``OmegaConf.to_yaml``: PyYAML's pure-Python emitter, width 80, OmegaConf's
representation of text) of a sweep job's ``.hydra/`` files, made from a template per document for many jobs.
``tests/test_fast_path.py`` checks the files byte for byte against Hydra's ``run_job``'s."""

from __future__ import annotations

import enum
import io
import re
import typing as tp

import yaml

#: YAML 1.1's words for booleans, which OmegaConf quotes when they are text (``omegaconf``'s dumper).
_YAML_BOOLS = frozenset("y Y yes Yes YES n N no No NO true True TRUE false False FALSE on On ON off Off OFF".split())  # noqa: SIM905
#: PyYAML's line width (``Emitter.best_width``), which OmegaConf's ``to_yaml`` leaves at its default.
WIDTH = 80


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
    its place, as the emitter writes it there, when that is sure to be what emitting the whole document gives: a
    scalar that the emitter writes on one line that ends within the line width (so that it wraps nowhere), or a
    list of such scalars (a block sequence at its key's indentation, PyYAML's style). Anything else (a mapping, a
    long or multi-line value) is emitted in full. Either way the text is what :func:`to_yaml` gives for the
    changed data."""

    def __init__(self, data: dict[str, tp.Any]) -> None:
        self._dumper = _OmegaConfDumper(io.StringIO(), default_flow_style=False, allow_unicode=True, sort_keys=False)
        self.root = self._represent(data)
        self._templates: dict[tuple[tuple[str, ...], ...], _Template | None] = {}

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
            filled = template.fill([self._line(changes[p]) for p in paths])
            if filled is not None:
                return filled
        return _emit(self._replace(self.root, {p: self._represent(v) for p, v in changes.items()}, ()))

    def _template(self, paths: tuple[tuple[str, ...], ...]) -> _Template | None:
        marks = [f"AMHMARK{i}X" for i in range(len(paths))]
        text = _emit(self._replace(self.root, {p: yaml.ScalarNode("tag:yaml.org,2002:str", m)
                                               for p, m in zip(paths, marks)}, ()))
        if any(text.count(m) != 1 for m in marks):
            return None
        return _Template(text, marks)

    def _line(self, value: tp.Any) -> list[str] | str | None:
        """How the emitter writes ``value`` as a mapping's value: one line (a scalar), a list of item lines (a list
        of scalars), or None (anything else)."""
        if isinstance(value, (list, tuple)):
            items = [self._line(v) for v in value]
            return tp.cast(list[str], items) if all(isinstance(i, str) for i in items) else None
        if isinstance(value, dict):
            return None
        text = _emit(self._represent(value))
        line, _, rest = text.partition("\n")
        return line if rest in ("", "...\n") and line not in ("", "...") else None

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


def _emit(node: yaml.Node) -> str:
    return tp.cast(str, yaml.serialize(node, Dumper=_OmegaConfDumper, allow_unicode=True))


class _Template:
    """A document's text with a marker where each changed value goes, each as a mapping's value (``key: MARK``)."""

    _LINE = re.compile(r"[^\n]*$")

    def __init__(self, text: str, marks: list[str]) -> None:
        where = sorted((text.index(m), i, m) for i, m in enumerate(marks))
        self.parts: list[str] = []  # text before each marker, in the document's order, then the rest
        self.order: list[int] = []  # which change each marker is
        self.columns: list[tuple[int, int] | None] = []  # (column, key indentation); None: not `key: MARK`
        pos = 0
        for at, i, m in where:
            before = text[pos:at]
            line = text[text.rfind("\n", 0, at) + 1:at]
            self.parts.append(before)
            self.order.append(i)
            self.columns.append((len(line), len(line) - len(line.lstrip(" "))) if line.endswith(": ") else None)
            pos = at + len(m)
        self.parts.append(text[pos:])

    def fill(self, lines: list[list[str] | str | None]) -> str | None:
        """The text with ``lines[i]`` (see ``YamlDoc._line``) in place of marker ``i``; None where a value might
        be written otherwise in the whole document (a line would pass the width, so the emitter could wrap it)."""
        out = []
        for k, i in enumerate(self.order):
            value, place, before = lines[i], self.columns[k], self.parts[k]
            if value is None or place is None:
                return None
            column, indent = place
            if isinstance(value, str):
                if column + len(value) > WIDTH:
                    return None
                out.append(before + value)
            elif not value:
                out.append(before + "[]")
            else:
                if any(indent + 2 + len(v) > WIDTH for v in value):
                    return None
                out.append(before[:-1] + "".join(f"\n{' ' * indent}- {v}" for v in value))
        out.append(self.parts[-1])
        return "".join(out)
