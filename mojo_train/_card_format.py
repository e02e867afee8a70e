"""Cards: the cross-vendor proof that the identical numeric mode gives the same bits everywhere.

Contract: a card (``fixtures/<name>.card``) is an append-only text file. Its first line is
the header ``# mojo_train card <name>; contract <contract>; inputs: ...``; other lines that
start with ``#`` are comments. Every other line is one case::

    <op> key=value key=value ... | output=<sha256 hex> output=<sha256 hex> ...

The left side determines the inputs completely: they are drawn by the library's own
``mt_uniform_fill`` (Philox4x32-10 of mt_pinned.h) -- params from stream 0, the step-k
gradients from stream k (k = 1, 2, ...), tensor j starting at element offset ``offsets[j]``
of its stream, uniform in ``[low, high)`` given by ``p=low,high`` / ``g=low,high``. Nothing
else is read from disk. The right side is the sha256 of every output's raw bytes (a float
scalar as its 4 little-endian float32 bytes).

There is one reader (:func:`read_card`), one runner (:func:`run_case`, through the public
API on the vendor's identical numeric mode) and one comparator (:func:`compare`). The cases are
also listed in code (:data:`CASES`); :func:`write_missing` appends, from the CPU oracle, the
lines of cases the file lacks and never touches a line already there -- a recomputed digest
that disagrees with the file is a failure of :func:`check_card`, never a rewrite.
"""
import collections
import contextlib
import hashlib
import os
import re
import struct
import zlib

from . import _native
from ._array import Array, float32_bits
from .device import DeviceArray, to_device

CARD_SUFFIX = ".card"
CONTRACTS = {}   # card -> contract version (register)
_INPUTS = "Philox4x32-10 of mt_pinned.h via mt_uniform_fill"
_HEADER = re.compile(r"^# mojo_train card (\w+); contract ([^;]+); inputs: (.+)$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_POW2 = re.compile(r"^(-?)2\*\*(-?\d+)$")


class CardError(ValueError):
    """A card file (or a case spec) that cannot be read; the message names the line."""


Case = collections.namedtuple("Case", "op args text")
Line = collections.namedtuple("Line", "case digests lineno")
Card = collections.namedtuple("Card", "name contract path lines")
Result = collections.namedtuple("Result", "case ok mismatches skipped", defaults=(None,))
# skipped: why the line was not run (a family its op needs that the library does not declare), else None


# ---- values of a case spec ------------------------------------------------------------------
def _number(text):
    """A finite float; ``2**-127`` and ``-2**-127`` are accepted beside Python literals."""
    m = _POW2.match(text)
    value = (-1.0 if m.group(1) else 1.0) * 2.0 ** int(m.group(2)) if m else float(text)
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError("%r is not finite" % text)
    return value


def _count(text):
    value = int(text)
    if value < 0:
        raise ValueError("%r is negative" % text)
    return value


def _flag(text):
    if text not in ("0", "1"):
        raise ValueError("%r is not 0 or 1" % text)
    return text == "1"


def _pair(text):
    parts = text.split(",")
    if len(parts) != 2:
        raise ValueError("%r is not a pair low,high" % text)
    return (_number(parts[0]), _number(parts[1]))


def _fraction(text):
    """A number in [0, 1] (a probability, a share of rows or pairs)."""
    value = _number(text)
    if not 0.0 <= value <= 1.0:
        raise ValueError("%r is not in [0, 1]" % text)
    return value


def _choice(*choices):
    """The parser of a key whose value is one of ``choices`` (named in this order when refused)."""
    def parse(text):
        if text not in choices:
            raise ValueError("%r is not one of %s" % (text, ", ".join(choices)))
        return text
    return parse


def _sizes_or_empty(text):
    """``1,3,1023`` or with repeats ``999x67,1000x66`` (67 tensors of 999 elements, ...); a size
    may be 0 (an empty tensor: the clip's lists)."""
    sizes = []
    for item in text.split(","):
        size, _, repeat = item.partition("x")
        sizes.extend([_count(size)] * (_count(repeat) if repeat else 1))
    if not sizes:
        raise ValueError("%r needs at least one tensor" % text)
    return tuple(sizes)


def _sizes(text):
    """``sizes=`` as _sizes_or_empty, without empty tensors."""
    sizes = _sizes_or_empty(text)
    if 0 in sizes:
        raise ValueError("%r needs at least one tensor and no empty tensor" % text)
    return sizes


_INPUT_KEYS = {"seed": _count, "sizes": _sizes, "g": _pair}   # a tensor list drawn as the module docstring says
# The header notes of a card whose inputs are tensor lists (optim, clip).
_LIST_NOTES = ("p=/g= low,high: params from stream 0, step-k grads from stream k (clip: stream 1),",
               "tensor j at offset offsets[j]; unset hyper-parameters take the public API defaults.")
_KEYS = {}      # op -> {key: parser}
_REQUIRED = {}  # op -> the keys a case must give
_OUTPUTS = {}   # op -> outputs(case)
_RUNNERS = {}   # op -> run(case, backend)
_NEEDS = {}     # op -> the feature families its lines call beyond the card's own
_NOTES = {}     # card -> the header's comment lines


def register(card, contract, cases, ops, notes, needs=None):
    """Add a card family: ``cases()`` lists its specs; ``ops`` maps each op name of its lines
    to ``(keys, required, outputs, run)``: the key parsers, the keys a case must give,
    ``outputs(case)`` (digest names in line order) and ``run(case, backend)`` ({name: sha256},
    through the public API on the selected vendor's identical numeric mode); ``notes`` are the
    header's comment lines saying how inputs are drawn; ``needs`` maps an op to the feature
    families (mt_features names) its lines call beyond the card's own."""
    CONTRACTS[card] = contract
    CASES[card] = cases
    _NOTES[card] = tuple("# " + n for n in notes)
    for op, (keys, required, outputs, run) in ops.items():
        _KEYS[op], _REQUIRED[op], _OUTPUTS[op], _RUNNERS[op] = keys, tuple(required), outputs, run
        _NEEDS[op] = tuple((needs or {}).get(op, ()))


def lacking(case, backend, card=None):
    """The families ``case`` needs -- its card's (a family name) and its op's beyond it -- that
    ``backend`` does not declare (mt_features)."""
    own = (card,) if card in _native.FEATURES else ()
    return [f for f in own + _NEEDS.get(case.op, ()) if not backend.has(f)]


def case_key(case):
    """What makes two specs the same case (the parsed values, not their spelling)."""
    return (case.op, tuple(sorted(case.args.items())))


def output_names(case):
    """The outputs a case's line must carry a digest for, in line order."""
    return tuple(_OUTPUTS[case.op](case))


# ---- the reader -----------------------------------------------------------------------------
def parse_case(spec, where):
    """The Case of ``<op> key=value ...``; CardError naming ``where`` when malformed."""
    tokens = spec.split()
    if not tokens or tokens[0] not in _KEYS:
        raise CardError("%s: a case starts with one of %s, got %r"
                        % (where, ", ".join(sorted(_KEYS)), tokens[0] if tokens else spec))
    op, keys, args = tokens[0], _KEYS[tokens[0]], {}
    for token in tokens[1:]:
        key, eq, text = token.partition("=")
        if not eq or not text:
            raise CardError("%s: expected key=value, got %r" % (where, token))
        if key not in keys:
            raise CardError("%s: %s takes no key %r (keys: %s)" % (where, op, key, ", ".join(sorted(keys))))
        if key in args:
            raise CardError("%s: key %r given twice" % (where, key))
        try:
            args[key] = keys[key](text)
        except ValueError as exc:
            raise CardError("%s: bad value for %s: %s" % (where, key, exc)) from None
    missing = [k for k in _REQUIRED[op] if k not in args]
    if missing:
        raise CardError("%s: %s case lacks %s" % (where, op, ", ".join(missing)))
    return Case(op, args, " ".join(tokens))


def parse_line(row, where):
    """(Case, {output: digest}) of one case row ``<spec> | name=<sha256> ...``."""
    spec, sep, outputs = row.partition(" | ")
    if not sep:
        raise CardError("%s: expected '<op> key=value ... | output=<sha256> ...' but there is "
                        "no ' | ' in %r" % (where, row))
    case = parse_case(spec, where)
    digests = {}
    for token in outputs.split():
        name, eq, digest = token.partition("=")
        if not eq or not _SHA256.match(digest):
            raise CardError("%s: expected output=<64 lowercase hex digits>, got %r" % (where, token))
        if name in digests:
            raise CardError("%s: output %r given twice" % (where, name))
        digests[name] = digest
    want = output_names(case)
    if sorted(digests) != sorted(want):
        raise CardError("%s: this %s case has outputs %s, the line gives %s"
                        % (where, case.op, ", ".join(want), ", ".join(digests) or "none"))
    return case, digests


def card_name(path):
    base = os.path.basename(path)
    if not base.endswith(CARD_SUFFIX):
        raise CardError("%s: a card file is named <name>%s" % (path, CARD_SUFFIX))
    return base[:-len(CARD_SUFFIX)]


def read_card(path):
    """The Card in ``path``; CardError (file:line and why) on any malformed or repeated line."""
    with open(path, encoding="utf-8") as f:
        rows = f.read().splitlines()
    m = _HEADER.match(rows[0]) if rows else None
    if not m or m.group(1) != card_name(path):
        raise CardError("%s:1: the first line must be '# mojo_train card %s; contract <contract>; "
                        "inputs: <generator>'" % (path, card_name(path)))
    lines, seen = [], {}
    for lineno, row in enumerate(rows[1:], 2):
        if not row.strip() or row.startswith("#"):
            continue
        case, digests = parse_line(row, "%s:%d" % (path, lineno))
        key = case_key(case)
        if key in seen:
            raise CardError("%s:%d: the same case as line %d" % (path, lineno, seen[key]))
        seen[key] = lineno
        lines.append(Line(case, digests, lineno))
    return Card(m.group(1), m.group(2), path, lines)


def format_line(case, digests):
    return "%s | %s" % (case.text, " ".join("%s=%s" % (n, digests[n]) for n in output_names(case)))


# ---- the numeric mode the cards run (identical; identical_ftz has cards of its own) ----------------
CARD_MODES = ("identical", "identical_ftz")
_MODE = ["identical"]


def mode():
    """The numeric mode the card runners pass to every call (``identical`` unless inside
    :func:`mode_selected`)."""
    return _MODE[-1]


@contextlib.contextmanager
def mode_selected(numeric_mode):
    """The cards run ``numeric_mode`` while inside (one of CARD_MODES)."""
    if numeric_mode not in CARD_MODES:
        raise CardError("cards exist for the numeric modes %s, not %r" % (", ".join(CARD_MODES), numeric_mode))
    _MODE.append(numeric_mode)
    try:
        yield
    finally:
        _MODE.pop()


# ---- the runner (public API, one vendor's identical numeric mode) ----------------------------------
@contextlib.contextmanager
def vendor_selected(vendor):
    """MOJO_TRAIN_VENDOR=vendor while inside (not thread-safe); yields its Backend of the cards'
    numeric mode (:func:`mode`)."""
    old = os.environ.get("MOJO_TRAIN_VENDOR")
    os.environ["MOJO_TRAIN_VENDOR"] = vendor
    try:
        yield _native.load(mode(), vendor)
    finally:
        if old is None:
            del os.environ["MOJO_TRAIN_VENDOR"]
        else:
            os.environ["MOJO_TRAIN_VENDOR"] = old


_ON_DEVICE = []   # non-empty while cards run on device buffers (see check_card)


def draw(backend, seed, stream, bounds, n, host=False):
    """n float32 of (seed, stream) from offset 0, uniform in ``bounds``, by the identical numeric
    mode's fill: a DeviceArray while cards run on device buffers (unless ``host``), else an Array.
    Identical cards draw with the vendor's own library (on its device when cards run there). Other
    modes' cards draw with the CPU oracle's identical library and upload: identical_ftz's own fill
    flushes (a subnormal bound reads as zero, no drawn value is subnormal), and a vendor may have
    no identical library at all (Metal), so their cards read the identical cards' inputs,
    subnormals included, and the flush rule applies from each op's first read of them on."""
    device = _ON_DEVICE and not host
    own = backend.numeric_mode == "identical"
    filler = backend if own else _native.load("identical", "cpu")
    a = DeviceArray((n,), "float32", numeric_mode=mode()) if device and own else Array((n,), "float32")
    rc = filler.lib.mt_uniform_fill(_native.ffi.cast("float *", a.ptr if device and own else a.address), seed, stream,
                                    0, bounds[0], bounds[1], n)
    filler.check(rc, "mt_uniform_fill")
    return to_device(a, numeric_mode=mode()) if device and not own else a


def _filled(backend, case, stream, bounds):
    """One float32 tensor per tensor of ``case`` (an Array, or a DeviceArray filled on the
    device when running on device buffers), drawn from (seed, stream) at flat offsets: the whole
    list in one fill, then copied out tensor by tensor (one launch, not one per tensor: a list of
    5,000 tensors drawn one launch each took minutes under compute-sanitizer's racecheck)."""
    sizes = case.args["sizes"]
    new = (lambda n: DeviceArray((n,), "float32", numeric_mode=mode())) if _ON_DEVICE else \
        (lambda n: Array((n,), "float32"))
    address = (lambda a: a.ptr) if _ON_DEVICE else (lambda a: a.address)
    ffi = _native.ffi
    whole = draw(backend, case.args["seed"], stream, bounds, sum(sizes))
    if len(sizes) == 1:
        return [whole]
    arrays, offset = [], 0
    for n in sizes:
        a = new(n)
        if n:
            backend.check(backend.lib.mt_memcpy(ffi.cast("void *", address(a)),
                                                ffi.cast("void *", address(whole) + 4 * offset), 4 * n), "mt_memcpy")
        arrays.append(a)
        offset += n
    return arrays


def _one_size(text):
    """``sizes=`` of a one-tensor case (random, elementwise): exactly one size."""
    sizes = _sizes(text)
    if len(sizes) != 1:
        raise ValueError("%r: one size expected" % text)
    return sizes


def _input(backend, case, stream, bounds):
    """Input tensor number ``stream`` of a one-tensor case (a 1-D float32 of the case's size)."""
    return _filled(backend, case, stream, bounds)[0]


def _named(*names):
    """An ``outputs(case)`` for register: the same output names for every case of the op."""
    return lambda case: names


def _sha(arrays=(), raw=b""):
    h = hashlib.sha256(raw)
    for a in arrays:
        h.update((a.to_host() if isinstance(a, DeviceArray) else a).tobytes())
    return h.hexdigest()


def _f32(*values):
    """The float32 bytes of ``values``, packed without the FPU (see _array.float32_bits): a caller's
    flush-to-zero mode must not change a card's digest."""
    return struct.pack("<%dI" % len(values), *[float32_bits(v) for v in values])


def run_case(case, backend):
    """{output: sha256 hex} of ``case`` on the vendor currently selected (see vendor_selected)."""
    return _RUNNERS[case.op](case, backend)


@contextlib.contextmanager
def _placed(device):
    if device:
        _ON_DEVICE.append(True)
    try:
        yield
    finally:
        if device:
            _ON_DEVICE.pop()


# ---- the comparator and the two card operations -------------------------------------------
def compare(want, got):
    """Names of the outputs whose digests differ (or are missing on either side)."""
    return [n for n in want if got.get(n) != want[n]] + [n for n in got if n not in want]


def check_card(path, vendor, device=False, shard=(0, 1), numeric_mode="identical"):
    """Run every line of the card on ``vendor``'s ``numeric_mode`` (identical, or identical_ftz for
    the cards of card_paths("identical_ftz")): a list of Result(case text, ok, mismatching
    outputs, skipped). A case that raises fails with ``raised <error>`` as its mismatch; a case
    whose op needs a family the library does not declare (register's ``needs``) is not run, ok
    False and ``skipped`` saying why. With ``device``,
    inputs are drawn straight into device memory and stay there. ``shard`` (k, n) runs the lines
    whose index is k modulo n only (n runs with k = 0..n-1 check every line once)."""
    card = read_card(path)
    results = []
    k, n = shard
    with mode_selected(numeric_mode), vendor_selected(vendor) as backend, _placed(device):
        for line in card.lines[k::n]:
            absent = lacking(line.case, backend, card.name)
            if absent:   # declared capabilities only: mt_features()
                results.append(Result(line.case.text, False, [], "needs %s (not in mt_features)" % ", ".join(absent)))
                continue
            try:
                bad = compare(line.digests, run_case(line.case, backend))
            except Exception as exc:  # a vendor that refuses a case fails it, visibly
                bad = ["raised %s: %s" % (type(exc).__name__, exc)]
            results.append(Result(line.case.text, not bad, bad))
    return results


def contract_of(name, numeric_mode="identical"):
    """The contract a card of ``name`` is for: its op's, and under identical_ftz the flush rule's too."""
    return CONTRACTS[name] + ("" if numeric_mode == "identical" else "+" + FTZ_CONTRACT)


FTZ_CONTRACT = "ftz/1"   # native/contracts/ftz.md


def _header(name, numeric_mode="identical"):
    return ["# mojo_train card %s; contract %s; inputs: %s" % (name, contract_of(name, numeric_mode), _INPUTS),
            "# append-only: a changed digest needs a contract version bump. A case line is",
            "#   <op> key=value ... | output=<sha256 of the output's bytes> ..."] + list(_NOTES[name])


def write_missing(path, numeric_mode="identical"):
    """Append, from the CPU oracle's ``numeric_mode``, a line for every case of the card that is
    defined in code but absent from the file (creating it with its header if needed). Existing
    lines are never rewritten. Returns the specs appended."""
    name = card_name(path)
    if name not in CASES:
        raise CardError("%s: no cases are defined in code for card %r" % (path, name))
    cases = [parse_case(spec, "%s (in code)" % name) for spec in CASES[name]()]
    have, prefix = set(), "\n".join(_header(name, numeric_mode)) + "\n"
    if os.path.exists(path):
        card = read_card(path)
        if card.contract != contract_of(name, numeric_mode):
            raise CardError("%s: the card is for contract %r, the code for %r; a contract bump "
                            "starts a new card file" % (path, card.contract, contract_of(name, numeric_mode)))
        have = {case_key(line.case) for line in card.lines}
        with open(path, "rb") as f:
            data = f.read()
        prefix = "" if not data or data.endswith(b"\n") else "\n"
    missing = []
    for c in cases:                     # in code order; a case listed twice is written once
        if case_key(c) not in have:
            have.add(case_key(c))
            missing.append(c)
    if not missing:
        return []
    with mode_selected(numeric_mode), vendor_selected("cpu") as backend:
        rows = [format_line(c, run_case(c, backend)) for c in missing]
    with open(path, "a", encoding="utf-8") as f:
        f.write(prefix + "".join(row + "\n" for row in rows))
    return [c.text for c in missing]


def fixtures_dirs():
    """Where cards are looked for: the installed package's folder first, then the checkout's."""
    package = os.path.dirname(os.path.abspath(__file__))
    return [os.path.join(package, "fixtures"), os.path.join(os.path.dirname(package), "fixtures")]


def card_folder(numeric_mode="identical"):
    """Where a fixtures folder keeps the cards of ``numeric_mode``: itself for identical, its
    subfolder of the mode's name otherwise (fixtures/identical_ftz/)."""
    return "" if numeric_mode == "identical" else numeric_mode


def card_paths(numeric_mode="identical"):
    """The ``*.card`` files of ``numeric_mode`` in the first fixtures folder that exists (sorted), or []."""
    for d in fixtures_dirs():
        if os.path.isdir(d):
            d = os.path.join(d, card_folder(numeric_mode))
            if not os.path.isdir(d):
                return []
            return sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(CARD_SUFFIX))
    return []


# ---- the cases, in code ---------------------------------------------------------------------
def _seeded(spec):
    """Give a spec its seed: a function of the rest of the spec, not of its place in a list."""
    op, _, rest = spec.partition(" ")
    return "%s seed=%d %s" % (op, zlib.crc32(spec.encode()) % 100000, rest)


UNIT = "-1,1"
SUB = "-2**-127,2**-127"        # the fill itself lands in the subnormal range
SUB_SQ = "-2**-64,2**-64"       # normal values whose squares are subnormal
BIG = 2 ** 20 + 7

CASES = {}   # card -> cases() (register)
