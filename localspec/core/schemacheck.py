"""What makes a JSON schema unusable as a grammar though llguidance compiles it, found before anything is decoded.

Two shapes compile and then fail mid-answer (issue 55): a `$ref` that requires itself with no way to end (no finite
value matches it: the grammar forces `{"a":{"a":…` until the library's item limit), and a choice of more structured
alternatives at one place than the library's Earley row holds (`max_items_in_row`, 2000: "Current row has 3000
items"). Both are told from the schema here, so the request is a 400 naming them; and a schema nested deeper than
the library reads is refused before the checks (which recurse) meet it. Local `$ref`s (`#`, `#/…`) are
read as JSON pointers into the schema they came from. `closed`: a schema whose objects take only the properties they
list, as tools' calls and structured outputs are constrained.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import unquote

# llguidance's default `max_items_in_row`: a choice of more object or array alternatives fails once the answer
# reaches it (a const, an enum or a string's alternatives are one lexeme, and do not count).
MAX_ALTERNATIVES = 2000
# serde_json's recursion limit, which llguidance reads a schema with (inside its own wrapping: a few levels less are
# left, and it refuses those in its own words): the checks here recurse, and never meet a deeper one.
MAX_DEPTH = 128
# Keywords whose values are data, not schemas: a `$ref` key inside them is a value.
DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples", "example"})
_STRUCTURED = ("properties", "items", "prefixItems", "additionalProperties", "allOf", "$ref")


def local_ref(ref: object) -> bool:
    """Whether `ref` is a JSON pointer into the schema it is in (`#`, `#/…`)."""
    return isinstance(ref, str) and (ref == "#" or ref.startswith("#/"))


def pointer(root: Any, ref: str) -> Any:
    """What the local `ref` points to in `root` (None where nothing is there)."""
    target = root
    for part in ref[2:].split("/") if ref != "#" else ():
        part = unquote(part).replace("~1", "/").replace("~0", "~")
        if isinstance(target, list) and part.isdigit() and int(part) < len(target):
            target = target[int(part)]
        else:
            target = target.get(part) if isinstance(target, dict) else None
    return target


def resolved(schema: Any, root: Any, hops: int = 8) -> Any:
    """`schema` with a local `$ref` at its top followed into `root` (a few hops at most; where one does not resolve,
    the schema as it is)."""
    while hops > 0 and isinstance(schema, dict) and local_ref(ref := schema.get("$ref")):
        target = pointer(root, ref)
        if not isinstance(target, dict):
            return schema
        schema, hops = target, hops - 1
    return schema


def problem(schema: Any) -> str | None:
    """What makes `schema` unusable as a grammar, as the end of a sentence ("has …"); None when nothing does."""
    if (depth := _depth(schema)) > MAX_DEPTH:  # first, and without recursion: the checks below recurse
        return f"nests {depth} levels deep: the grammar library reads at most {MAX_DEPTH}; flatten it"
    unending = _unending_ref(schema)
    if unending is not None:
        return (
            f"has {unending!r}, which requires itself with no way to end (no finite value matches it): make the "
            "property that refers to it optional, or give it an alternative without it"
        )
    widest, where = max(_choices(schema, ""), default=(0, ""))
    if widest > MAX_ALTERNATIVES:
        return (
            f"has a choice of {widest} object or array alternatives at {where or '/'}: at most {MAX_ALTERNATIVES} "
            "fit the grammar library; split it, or use an enum"
        )
    return None


def _depth(value: Any) -> int:
    """How deep arrays and objects nest in `value` (a scalar: 0), counted without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list):
            deepest = max(deepest, depth)
            stack.extend((v, depth + 1) for v in (node.values() if isinstance(node, dict) else node))
    return deepest


def _unending_ref(root: Any) -> str | None:
    """The first local `$ref` no finite value can match, where the schema as a whole needs one; else None."""
    refs = sorted(set(_refs(root)))
    finite: set[str] = set()
    grew = True
    while grew:  # a fixpoint: a ref ends once its target can end with the refs known to end
        grew = False
        for ref in refs:
            if ref not in finite and _ends(pointer(root, ref), finite):
                finite.add(ref)
                grew = True
    if _ends(root, finite):
        return None
    return next((r for r in refs if r not in finite), None)


def _ends(schema: Any, finite: set[str]) -> bool:
    """Whether some finite value matches `schema`, given the refs known to end (every other keyword is taken to
    allow one: only a cycle of refs is looked for)."""
    if not isinstance(schema, dict):
        return True
    props, required, min_items = schema.get("properties"), schema.get("required"), schema.get("minItems")
    needed = [schema.get("allOf")] if isinstance(schema.get("allOf"), list) else []  # every one must end
    needed += [[props[n]] for n in required or () if isinstance(props, dict) and isinstance(n, str) and n in props]
    if isinstance(min_items, int) and min_items > 0:
        needed.append([schema.get("items")])
    either = [schema[k] for k in ("anyOf", "oneOf") if isinstance(schema.get(k), list) and schema[k]]  # one must
    return (
        not (local_ref(ref := schema.get("$ref")) and ref not in finite)
        and all(_ends(s, finite) for group in needed for s in group)
        and all(any(_ends(s, finite) for s in branches) for branches in either)
    )


def _refs(schema: Any) -> Iterator[str]:
    for node in _nodes(schema, ""):
        if local_ref(ref := node[0].get("$ref")):
            yield ref


def _nodes(schema: Any, at: str) -> Iterator[tuple[dict, str]]:
    """Every subschema (a dict) of `schema` with its JSON pointer, data keywords' values left out."""
    if isinstance(schema, list):
        for i, item in enumerate(schema):
            yield from _nodes(item, f"{at}/{i}")
    elif isinstance(schema, dict):
        yield schema, at
        for key, value in schema.items():
            if key not in DATA_KEYWORDS:
                yield from _nodes(value, f"{at}/{key.replace('~', '~0').replace('/', '~1')}")


def _choices(schema: Any, at: str) -> Iterator[tuple[int, str]]:
    """Each `anyOf`/`oneOf`: how many structured alternatives it offers at its place (nested choices flattened,
    as the parser predicts them together), and where it is."""
    for node, where in _nodes(schema, at):
        for key in ("anyOf", "oneOf"):
            if isinstance(node.get(key), list):
                yield _alternatives(node[key]), f"{where}/{key}"


def _alternatives(branches: list) -> int:
    count = 0
    for branch in branches:
        if not isinstance(branch, dict):
            continue
        nested = branch.get("anyOf", branch.get("oneOf"))
        if isinstance(nested, list) and not any(k in branch for k in _STRUCTURED):
            count += _alternatives(nested)
        elif any(k in branch for k in _STRUCTURED) or branch.get("type") in ("object", "array"):
            count += 1
    return count


def closed(parameters: dict[str, Any]) -> dict[str, Any]:
    """A function's parameters as its call is constrained: only the parameters it declares, at every level
    (`additionalProperties` false where an object lists its `properties` and does not say, as OpenAI's strict function
    calling has it) — a small model constrained to an open object goes on inventing keys, in a nested one too (a
    pydantic model's `$defs`)."""
    return _closed(parameters) if parameters else {"type": "object"}


# Keywords whose values are subschemas, by shape: a map of them, a list of them, one.
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")
_SCHEMA_LISTS = ("anyOf", "oneOf", "prefixItems")
_SCHEMA_ONE = ("items", "additionalProperties")


def _closed(schema: Any) -> Any:
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    out.update(
        {k: {n: _closed(v) for n, v in schema[k].items()} for k in _SCHEMA_MAPS if isinstance(schema.get(k), dict)}
    )
    out.update({k: [_closed(v) for v in schema[k]] for k in _SCHEMA_LISTS if isinstance(schema.get(k), list)})
    out.update({k: _closed(schema[k]) for k in _SCHEMA_ONE if isinstance(schema.get(k), dict)})
    # An object composed with others (allOf, a $ref beside it) gets their properties too: it stays as it says.
    if "properties" in schema and not any(k in schema for k in ("additionalProperties", "allOf", "$ref")):
        out["additionalProperties"] = False
    return out
