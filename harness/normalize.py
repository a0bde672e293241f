"""Identifiers by identity: which values of a run are run-specific identifiers, learned
from two golden runs, and a run renamed so that a case equals its golden run up to a
one-to-one renaming of identifiers (docs/design.md, "Determinism").

The oracle compares a *document*: a JSON-like tree of dicts (string keys), lists and
atoms, built from a run's evidence (transcript, final state, the subject's effect ledger,
each provider's ledger; :func:`.oracle.evidence_document`). Positions in it are *paths*
(``("ledgers", "mail", 0, "request", "body")``); a *place* is a path with every list
index replaced by ``"*"`` (``("ledgers", "mail", "*", "request", "body")``).

**Learning** (:func:`learn`). The golden run is run twice, with different run ids in
fresh processes. The two documents are aligned (lists index by index, except the
*unordered* row lists, whose rows are matched by content) and compared atom by atom. A
value that differs between the two at the same place is an identifier when

- it is an *atom*: a string without whitespace or an integer (free text is never an
  identifier, though identifiers may appear inside it);
- the renaming is one-to-one: wherever run A holds ``a``, run B holds ``b``, and the
  reverse (a value that stays the same at one place and changes at another is not an
  identifier: it is data that changed);
- it is *used*: it appears at two or more positions of its run (created in one place,
  referenced in another: a key stored and then sent, a charge id answered and then
  recorded, a tool-call id in a reply and in its result), or at a place whose field
  name is declared an identifier (:data:`DECLARED_PLACES`: the providers' ``key`` and
  ``ref``, the effect ledger's ``key``; and the field names an adapter or a declared
  service gives, ``fields``).

Anything else that differs is a :class:`Difference`: the workload is not deterministic
(the determinism gate stops before the first case, naming the place and both values).

**Renaming** (:class:`Renamer`). In any run, golden or case, the identifiers are the
atoms found at the learned places (except values that were the same in both golden runs
at that place: :attr:`IdentifierModel.constants`). Each is replaced by a readable label
in order of first appearance: ``ch-1``, ``ch-2`` (the prefix is the value's own
alphabetic prefix, such as ``ch_`` or ``msg_``, when the two golden runs' values share
it *at the place the value is found*: :attr:`IdentifierModel.prefixes`; else the field
name it was found under: ``key-1``. A random key, URL-safe base64 say, starts like
``Qx_...`` or even ``Ch_...`` now and then: at its key's place that is no prefix, or its
label would change from run to run and a correct runtime would fail a case in a hundred
or so: ``tests/unit/test_unit_normalize.py``). Identifiers of six characters or more are also replaced where they appear
inside longer strings (a charge id quoted in a mail body); shorter ones (integers from a
sequence) only at identifier places, so that ``17`` the key is not confused with ``17``
the quantity. Never masked: a second charge is ``ch-2``, not another ``ch-1``, so a key
reused where the golden run used two (or two where it used one) is still a difference.
Rows of an unordered list are labelled in an order that does not depend on their
identifiers' raw values.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

Path = tuple[Any, ...]
Place = tuple[str, ...]

MIN_EMBEDDED_LEN = 6
"""Identifiers at least this long are also renamed inside longer strings."""
MAX_ATOM_LEN = 512
DECLARED_PLACES: frozenset[Place] = frozenset({
    ("effects", "*", "key"), ("ledgers", "*", "*", "key"), ("ledgers", "*", "*", "ref"),
    ("transcript", "*", "tool_calls", "*", "id"), ("transcript", "*", "tool_call_id"),
})
"""Places that hold identifiers whatever the run does: the subject's effect ledger's
idempotency key, each provider ledger row's key and provider-side object id, and the
chat format's tool-call ids (``tool_calls[].id`` and a tool message's ``tool_call_id``,
which a framework may mint itself: Pydantic AI does when a model reply carries none,
and a run that uses one only once would otherwise read as data; ``*`` matches any one
component: the provider's name, a row, a message)."""

_PREFIX_RE = re.compile(r"([A-Za-z]{2,12})[_-][A-Za-z0-9]")
_FIELD_RE = re.compile(r"[^A-Za-z0-9]+")
_SPACE_RE = re.compile(r"\s")
"""Any whitespace character: ``\\s`` of a str pattern is :meth:`str.isspace`'s set."""


def place_of(path: Path) -> Place:
    """``path`` with list indices replaced by ``"*"``."""
    return tuple("*" if isinstance(p, int) else str(p) for p in path)


def _component(key: Any) -> str:
    """One component of a place, as :func:`place_of` makes it."""
    return "*" if isinstance(key, int) else str(key)


def is_atom(value: Any) -> bool:
    """A value that can be an identifier: a non-empty string without whitespace (at most
    :data:`MAX_ATOM_LEN` characters) or an integer (not a bool)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    return isinstance(value, str) and 0 < len(value) <= MAX_ATOM_LEN and _SPACE_RE.search(value) is None


def _ident(value: Any) -> str:
    """The identity of an atom: ``17`` and ``"17"`` are one identifier (a key stored as an
    integer and sent as a string)."""
    return str(value)


@dataclass(frozen=True)
class Difference:
    """Two golden runs disagree at ``path`` (run A's path): ``first`` vs ``second``
    (``MISSING`` when one side has nothing there). ``why`` says what kind of difference."""

    path: Path
    first: Any
    second: Any
    why: str = "values differ"

    def describe(self) -> str:
        """``provider mail, request 2, body: '...' vs '...'`` (see :func:`describe_path`)."""
        a, b = _excerpts(self.first, self.second)
        return f"{describe_path(self.path)}: {a} vs {b}" + ("" if self.why == "values differ" else f" ({self.why})")


MISSING = "<missing>"


def describe_path(path: Path) -> str:
    """A path of an oracle document in words: ``provider mail, request 2, body``,
    ``transcript, message 4, tool_calls[0].arguments.body``, ``effects ledger, row 1, key``."""
    head, rest = (path[0] if path else ""), list(path[1:])
    if head == "ledgers" and len(rest) >= 1:
        out = f"provider {rest[0]}"
        rest = rest[1:]
        if rest and isinstance(rest[0], int):
            out += f", request {rest[0] + 1}"
            rest = rest[1:]
    elif head == "transcript":
        out = "transcript"
        if rest and isinstance(rest[0], int):
            out += f", message {rest[0] + 1}"
            rest = rest[1:]
    elif head == "effects":
        out = "effects ledger"
        if rest and isinstance(rest[0], int):
            out += f", row {rest[0] + 1}"
            rest = rest[1:]
    elif head == "trace":
        out = "crash-point trace"
    else:
        out = str(head)
    tail = ""
    for p in rest:
        tail += f"[{p}]" if isinstance(p, int) else (f".{p}" if tail else str(p))
    return out + (f", {tail}" if tail else "")


def _excerpts(a: Any, b: Any, width: int = 70) -> tuple[str, str]:
    """Both values as short reprs; long strings cut around their first difference."""
    if not (isinstance(a, str) and isinstance(b, str)) or max(len(a), len(b)) <= width:
        return _short(a, width), _short(b, width)
    i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    start = max(0, i - width // 3)

    def cut(s: str) -> str:
        piece = s[start:start + width]
        return repr(("..." if start else "") + piece + ("..." if start + width < len(s) else ""))

    return cut(a), cut(b)


def _short(value: Any, width: int = 70) -> str:
    text = value if value is MISSING else repr(value)
    return text if len(text) <= width else text[:width - 3] + "..."


@dataclass(frozen=True)
class IdentifierModel:
    """Where a run's identifiers live, learned from two golden runs (:func:`learn`).

    ``places``: places whose atoms are identifiers; ``fields``: field names declared to
    hold identifiers wherever they appear; ``constants``: per identifier place, the
    values that were equal in both golden runs there (they stay literal)."""

    places: frozenset[Place] = frozenset()
    fields: frozenset[str] = frozenset()
    constants: Mapping[Place, frozenset[str]] = field(default_factory=dict)
    #: per identifier place, the identifiers' own prefixes (``ch``, ``msg``) that both
    #: golden runs' values had at the same identifier found there: the only ones labels
    #: of values found at that place are made of
    prefixes: Mapping[Place, frozenset[str]] = field(default_factory=dict)

    def holds_identifiers(self, place: Place) -> bool:
        return place in self.places or declared(place, self.fields)

    def identifier_places(self) -> Callable[[Place], bool]:
        """:meth:`holds_identifiers` remembered per place: a document has few places and
        many leaves (the oracle asks for every leaf of every case)."""
        known: dict[Place, bool] = {}

        def holds(place: Place) -> bool:
            answer = known.get(place)
            if answer is None:
                answer = known[place] = self.holds_identifiers(place)
            return answer

        return holds

    def to_dict(self) -> dict[str, Any]:
        """JSON shape (the golden cache stores it)."""
        return {"places": sorted(list(p) for p in self.places), "fields": sorted(self.fields),
                "constants": sorted([list(p), sorted(v)] for p, v in self.constants.items()),
                "prefixes": sorted([list(p), sorted(v)] for p, v in self.prefixes.items())}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> IdentifierModel:
        return cls(frozenset(tuple(p) for p in data.get("places", ())), frozenset(data.get("fields", ())),
                   {tuple(p): frozenset(v) for p, v in data.get("constants", ())},
                   {tuple(p): frozenset(v) for p, v in data.get("prefixes", ())})

    def identifiers_in(self, doc: Any) -> dict[str, Place]:
        """The identifiers of one run's document: each atom at an identifier place (not a
        constant there), with the place it was first found at (walk order)."""
        out: dict[str, Place] = {}
        holds = self.identifier_places()
        constants = self.constants

        def leaf(value: Any, place: Place) -> None:
            if holds(place) and is_atom(value):
                ident = _ident(value)
                if ident not in out and ident not in constants.get(place, ()):
                    out[ident] = place

        def visit(value: Any, place: Place) -> None:  # walk_places's order, without its generators
            if isinstance(value, dict):
                key_place = place + ("<key>",)
                for k, v in value.items():
                    leaf(k, key_place)
                    visit(v, place + (_component(k),))
            elif isinstance(value, list | tuple):
                item_place = place + ("*",)
                for v in value:
                    visit(v, item_place)
            else:
                leaf(value, place)

        visit(doc, ())
        return out


def matches(pattern: Place, place: Place) -> bool:
    """Whether ``place`` fits ``pattern``, where a ``"*"`` in the pattern stands for any one
    component (a list position, a provider's name)."""
    return len(pattern) == len(place) and all(x == "*" or x == y for x, y in zip(pattern, place))


@functools.lru_cache(maxsize=4096)
def declared(place: Place, fields: frozenset[str] = frozenset()) -> bool:
    """Whether ``place`` holds identifiers by declaration: one of :data:`DECLARED_PLACES`,
    or a field named in ``fields`` (an adapter's or a declared service's)."""
    if place and place[-1] in fields:
        return True
    return any(matches(p, place) for p in DECLARED_PLACES)


def walk(value: Any, path: Path = ()) -> Iterable[tuple[Path, Any]]:
    """Every leaf of ``value`` with its path, in document order; a dict key counts as a
    leaf at ``path + ("<key>",)`` so identifiers used as keys are seen too."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield path + ("<key>",), k
            yield from walk(v, path + (k,))
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            yield from walk(v, path + (i,))
    else:
        yield path, value


def walk_places(value: Any, place: Place = ()) -> Iterable[tuple[Place, Any]]:
    """:func:`walk` with each leaf's place instead of its path (``place_of(path)``, built
    as the walk goes down rather than once per leaf)."""
    if isinstance(value, dict):
        key_place = place + ("<key>",)
        for k, v in value.items():
            yield key_place, k
            yield from walk_places(v, place + (_component(k),))
    elif isinstance(value, list | tuple):
        item_place = place + ("*",)
        for v in value:
            yield from walk_places(v, item_place)
    else:
        yield place, value


# -- learning -------------------------------------------------------------------------


def _similarity(a: Any, b: Any) -> int:
    """How many leaves two rows share (same path, same value): the rows of an unordered
    list are matched greedily by it."""
    la = {(p, json.dumps(v, sort_keys=True, default=str)) for p, v in walk(a)}
    lb = {(p, json.dumps(v, sort_keys=True, default=str)) for p, v in walk(b)}
    return len(la & lb)


def _match_rows(a: list[Any], b: list[Any]) -> list[tuple[int, int]]:
    """Pairs ``(i, j)`` of rows of ``a`` and ``b`` (same length), most similar first;
    ties keep the lists' own order."""
    scores = sorted(((-_similarity(x, y), i, j) for i, x in enumerate(a) for j, y in enumerate(b)))
    used_a: set[int] = set()
    used_b: set[int] = set()
    pairs = []
    for _, i, j in scores:
        if i not in used_a and j not in used_b:
            used_a.add(i)
            used_b.add(j)
            pairs.append((i, j))
    return sorted(pairs)


def _align(a: Any, b: Any, path: Path, unordered: frozenset[Place],
           pairs: list[tuple[Path, Any, Any]], diffs: list[Difference]) -> None:
    """Walk ``a`` and ``b`` together, appending aligned leaf pairs and structural
    differences."""
    if isinstance(a, dict) and isinstance(b, dict):
        only_a = [k for k in a if k not in b]
        only_b = [k for k in b if k not in a]
        for k in a:
            if k in b:
                _align(a[k], b[k], path + (k,), unordered, pairs, diffs)
        if len(only_a) == len(only_b):  # keys that are themselves identifiers, in order
            for ka, kb in zip(only_a, only_b):
                pairs.append((path + ("<key>",), ka, kb))
                _align(a[ka], b[kb], path + (ka,), unordered, pairs, diffs)
        else:
            for k in only_a:
                diffs.append(Difference(path + (k,), a[k], MISSING, "only in the first run"))
            for k in only_b:
                diffs.append(Difference(path + (k,), MISSING, b[k], "only in the second run"))
        return
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        if len(a) != len(b):
            diffs.append(Difference(path, f"{len(a)} item(s)", f"{len(b)} item(s)", "different lengths"))
            return
        rows = any(matches(p, place_of(path)) for p in unordered)
        order = _match_rows(list(a), list(b)) if rows else [(i, i) for i in range(len(a))]
        for i, j in order:
            _align(a[i], b[j], path + (i,), unordered, pairs, diffs)
        return
    pairs.append((path, a, b))


@dataclass
class _Aligned:
    """What :func:`learn` reads off the aligned leaf pairs of two runs: values that
    differ (``forward``: run A's value -> run B's values at the same places, ``backward``
    the reverse, ``uses``: how often A's value occurs, ``candidate_places`` where,
    ``first_path`` its first path), values equal in both (``same``; ``same_at`` with
    their places; ``constants``: place -> values), and ``texts``: pairs that are not both
    atoms (free text, mismatched types), compared once the identifiers are known."""
    forward: dict[str, set[str]] = field(default_factory=dict)
    backward: dict[str, set[str]] = field(default_factory=dict)
    same: set[str] = field(default_factory=set)
    uses: dict[str, int] = field(default_factory=dict)
    candidate_places: dict[str, set[Place]] = field(default_factory=dict)
    constants: dict[Place, set[str]] = field(default_factory=dict)
    first_path: dict[str, Path] = field(default_factory=dict)
    texts: list[tuple[Path, Any, Any]] = field(default_factory=list)
    same_at: set[tuple[Place, str]] = field(default_factory=set)


def _sort_pairs(pairs: list[tuple[Path, Any, Any]]) -> _Aligned:
    """Sort the aligned leaf pairs ``(path, a, b)`` into equal values, differing atoms
    and the rest (:class:`_Aligned`)."""
    al = _Aligned()
    for path, a, b in pairs:
        place = place_of(path)
        if a == b and type(a) is type(b):
            if is_atom(a):
                al.same.add(_ident(a))
                al.same_at.add((place, _ident(a)))
                al.constants.setdefault(place, set()).add(_ident(a))
            continue
        if is_atom(a) and is_atom(b):
            ia, ib = _ident(a), _ident(b)
            al.forward.setdefault(ia, set()).add(ib)
            al.backward.setdefault(ib, set()).add(ia)
            al.uses[ia] = al.uses.get(ia, 0) + 1
            al.candidate_places.setdefault(ia, set()).add(place)
            al.first_path.setdefault(ia, path)
        else:
            al.texts.append((path, a, b))
    return al


def _count_embedded_uses(first: Any, al: _Aligned) -> None:
    """Add to ``al.uses`` each occurrence of a long differing value of run A inside run
    A's free text: an identifier used there counts as used twice."""
    long_ids = [i for i in al.forward if len(i) >= MIN_EMBEDDED_LEN]
    if long_ids:
        embedded = _embedded_re(long_ids)
        for _, value in walk(first):
            if isinstance(value, str) and not is_atom(value):
                for m in embedded.finditer(value):
                    al.uses[m.group(0)] = al.uses.get(m.group(0), 0) + 1


def _accept_renamings(al: _Aligned, fields: frozenset[str], diffs: list[Difference]
                      ) -> tuple[set[Place], dict[str, str]]:
    """The differing values that are identifiers: returns their places and the renaming
    (run A's value -> run B's); appends a :class:`Difference` for each that is not (not
    one-to-one, equal elsewhere in the run, or used once at an undeclared place)."""
    places: set[Place] = set()
    accepted: dict[str, str] = {}
    for ia, targets in al.forward.items():
        path = al.first_path[ia]
        ib = next(iter(targets))
        declared_here = any(declared(p, fields) for p in al.candidate_places[ia])
        if len(targets) > 1 or len(al.backward[ib]) > 1:
            diffs.append(Difference(path, ia, " / ".join(sorted(targets)),
                                    "not a one-to-one renaming: the value is used differently in the two runs"))
        elif any((p, i) in al.same_at for p in al.candidate_places[ia] for i in (ia, ib)) or (
                len(ia) >= MIN_EMBEDDED_LEN and (ia in al.same or ib in al.same)):
            # a long value that changes at one place and not at another is data; a short
            # one ("1") may equal an unrelated constant elsewhere by chance
            diffs.append(Difference(path, ia, ib, "the value stays the same elsewhere in the run"))
        elif al.uses[ia] < 2 and not declared_here:
            diffs.append(Difference(path, ia, ib))
        else:
            places |= al.candidate_places[ia]
            accepted[ia] = ib
    return places, accepted


def _shared_prefixes(accepted: dict[str, str], al: _Aligned) -> dict[Place, frozenset[str]]:
    """Place -> the value prefixes (``ch`` of ``ch_3f...``) both runs' identifiers there share."""
    shared_prefixes: dict[Place, set[str]] = {}
    for ia, ib in accepted.items():
        if (pa := _value_prefix(ia)) and pa == _value_prefix(ib):
            for p in al.candidate_places[ia]:
                shared_prefixes.setdefault(p, set()).add(pa)
    return {p: frozenset(v) for p, v in shared_prefixes.items()}


def _text_differences(al: _Aligned, accepted: dict[str, str], prefixes: dict[Place, frozenset[str]],
                      diffs: list[Difference]) -> None:
    """Append a :class:`Difference` for each of ``al.texts`` that is not equal once run
    A's identifiers are replaced by run B's (``accepted``); a differing text is shown
    with both runs' identifiers as one label, so only what differs remains."""
    # what is left must be equal once run A's identifiers are replaced by run B's: free
    # text that differs only by identifiers inside it passes, anything else is a
    # difference of its own
    long_accepted = [i for i in accepted if len(i) >= MIN_EMBEDDED_LEN]
    if long_accepted:  # shown with both runs' identifiers as one label: only what differs remains
        swap, back = _embedded_re(long_accepted), _embedded_re([accepted[i] for i in long_accepted])
        counts: dict[str, int] = {}
        labels = {}
        for ia in long_accepted:
            prefix = _prefix(ia, min(al.candidate_places[ia]), prefixes)
            counts[prefix] = counts.get(prefix, 0) + 1
            labels[ia] = f"<{prefix}-{counts[prefix]}>"
        labels_b = {accepted[ia]: label for ia, label in labels.items()}
    for path, a, b in al.texts:
        if isinstance(a, str) and isinstance(b, str) and long_accepted:
            if swap.sub(lambda m: accepted[m.group(0)], a) == b:
                continue
            a, b = swap.sub(lambda m: labels[m.group(0)], a), back.sub(lambda m: labels_b[m.group(0)], b)
        diffs.append(Difference(path, a, b))


def learn(first: Any, second: Any, *, fields: Iterable[str] = (), unordered: Iterable[Place] = ()
          ) -> tuple[IdentifierModel, list[Difference]]:
    """Learn the identifiers of a workload from two golden runs' documents (module
    docstring); returns the model and every difference that is not a renaming of
    identifiers (empty: the two runs are the same run up to identifiers)."""
    unordered_places = frozenset(tuple(p) for p in unordered)
    fields = frozenset(fields)
    pairs: list[tuple[Path, Any, Any]] = []
    diffs: list[Difference] = []
    _align(first, second, (), unordered_places, pairs, diffs)
    al = _sort_pairs(pairs)
    # identifiers that also sit inside the other run's free text count as used there
    _count_embedded_uses(first, al)
    places, accepted = _accept_renamings(al, fields, diffs)
    prefixes = _shared_prefixes(accepted, al)
    model = IdentifierModel(frozenset(places), fields,
                            {p: frozenset(v) for p, v in al.constants.items() if p in places or declared(p, fields)},
                            prefixes)
    _text_differences(al, accepted, prefixes, diffs)
    return model, sorted(diffs, key=lambda d: _sort_key(d.path))


def _embedded_re(idents: Iterable[str]) -> re.Pattern[str]:
    """Matches any of ``idents`` inside a string, not as part of a longer alphanumeric run
    (longest first, so an identifier that contains another is replaced whole)."""
    alternatives = "|".join(re.escape(i) for i in sorted(idents, key=len, reverse=True))
    return re.compile(f"(?<![A-Za-z0-9])(?:{alternatives})(?![A-Za-z0-9])")


_ALNUM = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")


class _Embedded:
    """Replaces the identifiers ``idents`` found inside a string exactly as
    ``_embedded_re(idents).sub`` does (leftmost first, the longest at one position, not
    inside a longer alphanumeric run, left to right), without compiling a pattern when
    they are few: a run's identifiers are new to the matrix, so its pattern was compiled
    anew for every renamer (about as much CPU as the rest of its renaming). Few: each is
    looked for with ``str.__contains__``, and the strings holding one are scanned with
    ``str.find``; more than :attr:`FEW`: the compiled pattern."""

    FEW = 32

    def __init__(self, idents: Iterable[str]) -> None:
        self.idents = sorted(idents, key=len, reverse=True)
        self.pattern = _embedded_re(self.idents) if len(self.idents) > self.FEW else None

    def replace(self, text: str, label: Callable[[str], str]) -> str:
        """``text`` with each identifier in it replaced by ``label(identifier)`` (called in
        order of appearance)."""
        if self.pattern is not None:
            return self.pattern.sub(lambda m: label(m.group(0)), text)
        hits = [i for i in self.idents if i in text]
        if not hits:
            return text
        out, pos, size = [], 0, len(text)
        while True:
            at, found = -1, None
            for ident in hits:  # longest first: at one position the longest wins
                n = len(ident)
                k = text.find(ident, pos)
                while k >= 0 and ((k > 0 and text[k - 1] in _ALNUM) or (k + n < size and text[k + n] in _ALNUM)):
                    k = text.find(ident, k + 1)
                if k >= 0 and (found is None or k < at):
                    at, found = k, ident
            if found is None:
                break
            out.append(text[pos:at])
            out.append(label(found))
            pos = at + len(found)
        out.append(text[pos:])
        return "".join(out)


def _sort_key(path: Path) -> tuple[Any, ...]:
    return tuple((0, p) if isinstance(p, int) else (1, str(p)) for p in path)


# -- renaming -------------------------------------------------------------------------


def _value_prefix(ident: str) -> str | None:
    """``ch`` of ``ch_3f...`` (lower-cased), or None."""
    m = _PREFIX_RE.match(ident)
    return m.group(1).lower() if m else None


def _prefix(ident: str, place: Place, prefixes: Mapping[Place, frozenset[str]]) -> str:
    """The label prefix of ``ident`` found at ``place``: its own prefix when the golden
    pair's identifiers had it there (``prefixes``), else the name of the field."""
    own = _value_prefix(ident)
    if own is not None and own in prefixes.get(place, ()):
        return own
    name = next((p for p in reversed(place) if p not in ("*", "<key>")), "id")
    return _FIELD_RE.sub("_", name).strip("_").lower() or "id"


class Renamer:
    """Renames one run's identifiers by order of first appearance (module docstring).

    Built from the model and the run's whole document (which fixes *which* values are
    identifiers); values must then be renamed in a canonical order, the same for every
    run (the oracle renames the transcript first, then the rows of the effect ledger and
    of each provider ledger), so that the n-th identifier means the same thing in both.
    :meth:`copy` gives a renamer that continues this one's numbering without changing it
    (one per provider ledger: an extra mail must not shift the payment ledger's labels).
    """

    def __init__(self, model: IdentifierModel, doc: Any) -> None:
        self.model = model
        self._holds = model.identifier_places()
        found = model.identifiers_in(doc)
        self.idents: dict[str, Place] = found
        self.seen: dict[str, str] = {}
        self.counts: dict[str, int] = {}
        long_ids = [i for i in found if len(i) >= MIN_EMBEDDED_LEN]
        self._embedded = _Embedded(long_ids) if long_ids else None

    def copy(self) -> Renamer:
        other = object.__new__(Renamer)
        other.model, other.idents, other._embedded, other._holds = self.model, self.idents, self._embedded, self._holds
        other.seen, other.counts = dict(self.seen), dict(self.counts)
        return other

    def label(self, ident: str) -> str:
        if ident not in self.seen:
            prefix = _prefix(ident, self.idents.get(ident, ()), self.model.prefixes)
            self.counts[prefix] = self.counts.get(prefix, 0) + 1
            self.seen[ident] = f"{prefix}-{self.counts[prefix]}"
        return self.seen[ident]

    def rename_value(self, value: Any, place: Place) -> Any:
        """One leaf at ``place``: an identifier becomes its label; a string has the long
        identifiers inside it replaced."""
        if isinstance(value, bool) or value is None or isinstance(value, float):
            return value
        ident = _ident(value)
        if ident in self.idents and is_atom(value) and (len(ident) >= MIN_EMBEDDED_LEN or self._holds(place)):
            if ident not in self.model.constants.get(place, ()):
                return self.label(ident)
        if isinstance(value, str) and self._embedded is not None:
            return self._embedded.replace(value, self.label)
        return value

    def __call__(self, value: Any, path: Path = ()) -> Any:
        """``value`` (found at ``path`` of the document) with every identifier renamed."""
        return self._rename(value, place_of(path))

    def _rename_str(self, value: str, place: Place) -> str:
        """:meth:`rename_value` of a ``str`` leaf (the common one), the same result with
        fewer steps: a string shorter than :data:`MIN_EMBEDDED_LEN` holds no identifier
        inside it, so the embedded pattern is not run over it."""
        if value in self.idents and is_atom(value) and (len(value) >= MIN_EMBEDDED_LEN or self._holds(place)):
            if value not in self.model.constants.get(place, ()):
                return self.label(value)
        if self._embedded is not None and len(value) >= MIN_EMBEDDED_LEN:
            return self._embedded.replace(value, self.label)
        return value

    def _rename(self, value: Any, place: Place) -> Any:
        if type(value) is str:
            return self._rename_str(value, place)
        if isinstance(value, dict):
            key_place = place + ("<key>",)
            out = {}
            for k, v in value.items():  # the key first: it may take a label before its value's identifiers
                if type(k) is str:
                    out[self._rename_str(k, key_place)] = self._rename(v, place + (k,))
                else:
                    key = self.rename_value(k, key_place) if isinstance(k, str) else k
                    out[key] = self._rename(v, place + (_component(k),))
            return out
        if isinstance(value, list | tuple):
            item_place = place + ("*",)
            return [self._rename(v, item_place) for v in value]
        return self.rename_value(value, place)

    def rows(self, rows: list[Any], path: Path) -> list[Any]:
        """Rename the rows of an unordered list found at ``path``: labelled in an order
        that does not depend on the identifiers' raw values (identifiers already labelled
        show their label, the others are hidden), then sorted by their renamed form."""
        def masked(item: tuple[int, Any]) -> str:
            i, row = item
            probe = self.copy()
            probe.label = lambda ident: probe.seen.get(ident, "\x00")  # type: ignore[method-assign]
            return json.dumps(probe(row, path + (i,)), sort_keys=True, default=str)

        renamed = [self(row, path + (i,)) for i, row in sorted(enumerate(rows), key=masked)]
        return sorted(renamed, key=lambda r: json.dumps(r, sort_keys=True, default=str))
