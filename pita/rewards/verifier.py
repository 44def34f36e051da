"""Math answer extraction and verification: is a completion's final answer the gold answer?

    >>> verify("... so she sold 48 + 24 = 72 clips. #### 72", "72")
    Verdict(correct=True, extracted='72', reason='')
    >>> score_math(["\\boxed{\\frac{1}{2}}", "0.4"], ["0.5", "0.5"], mode="auto")
    [1.0, 0.0]

Extraction (``extract_answer``) picks the answer span out of a completion by one of the modes in
``MODES``; comparison goes through math-verify (symbolic / numeric equivalence, so ``\\frac{1}{2}``
equals ``0.5``). math-verify's timeouts use ``signal.alarm``, which works only in a process's
main thread: where verification runs there (job workers, torchrun ranks, TRL's reward calls) they
are on, at ``VERIFY_TIMEOUT_S`` for the parse and for the comparison; in any other thread they are
off and the time is bounded here instead (``_too_costly`` refuses the known blow-ups). Either
way only the extracted answer (at most ``MAX_ANSWER_CHARS`` characters) ever reaches the parser,
never the whole completion.
When math-verify cannot parse a side, the comparison falls back to normalised string and exact
numeric equality. A malformed answer is never an exception: it is a Verdict that is incorrect
and says why.

Normalisation here (``normalize_answer``) only removes what cannot carry meaning (dollar signs,
thin spaces, a whole-answer ``\\text{}``, the commas of a lone grouped number); LaTeX is read
by math-verify's own normalisation, so matrices, intervals and pairs reach it as written.
``same_answer`` is the same comparison between two extracted answers (maj@n groups votes by it).
"""

from __future__ import annotations


import logging
import re
from dataclasses import dataclass
from functools import lru_cache
from fractions import Fraction

# math-verify (and sympy under it: 0.3 s of imports) loads when the first answer is compared, not
# when a command that never compares one (a bad key, pita plan, pita status) imports this module.
def _mv_parse(*args, **kwargs):
    from math_verify import parse

    return parse(*args, **kwargs)


def _mv_verify(*args, **kwargs):
    from math_verify import verify

    return verify(*args, **kwargs)


class _TimeoutsOffOnPurpose(logging.Filter):
    """math-verify warns in every process that its timeouts are off; outside a main thread they are
    off on purpose (module docstring) and the time is bounded here, so the warning would only tell
    a reader of run.log to fix something that is not broken."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_TimeoutsOffOnPurpose())

MODES = ("auto", "boxed", "hash", "last_number")

# An extracted answer longer than this is not handed to math-verify (whose time is unbounded
# with timeouts off); it is still compared as a normalised string.
MAX_ANSWER_CHARS = 300
# math-verify's own timeouts (seconds, for its parse and for its comparison) where they can work
VERIFY_TIMEOUT_S = 2


def _timeout() -> int | None:
    """VERIFY_TIMEOUT_S in a main thread of a platform with SIGALRM, else None (timeouts off)."""
    import signal
    import threading

    if hasattr(signal, "SIGALRM") and threading.current_thread() is threading.main_thread():
        return VERIFY_TIMEOUT_S
    return None

_BOX_CMDS = ("\\boxed", "\\fbox")

# A number: optional minus (not a hyphen inside a word or range like "3-5"), integer part with
# or without thousands commas, optional decimals, optional "/denominator" (a simple fraction).
_NUMBER = re.compile(
    r"(?<![\w.])(?:-\s?)?"
    r"(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?"
    r"(?:/\d+(?:\.\d+)?)?"
    r"|(?<![\w.])(?:-\s?)?\.\d+"
)
_LATEX_FRAC = re.compile(r"(-?)\s*\\[dt]?frac\s*\{\s*(-?\d+)\s*\}\s*\{\s*(-?\d+)\s*\}")
_TEXT_WRAPPED = re.compile(r"^\\(?:text|textbf|mathrm|mbox)\s*\{([^{}]*)\}$")
# A backslash pair, read left to right: "\\" (a LaTeX row break in a matrix or column vector) is
# kept whole; a thin space "\," "\;" "\:" is dropped (spacing only), and so is "\!" with the spaces
# after it, as math-verify does ("11,\! 111" is MATH's thousands separator). Reading pairs is what
# keeps "\\ 2/3" intact: a rule that looks at one backslash at a time takes the second backslash
# and the space for a control space, drops both, and the matrix parses as its first entry.
_BACKSLASH_PAIR = re.compile(r"\\(\\|[,;:]|!\s*)")
# A whole answer that is one number with thousands commas ("1,000", "11,111,111,100"). Only the
# whole answer: a comma between digits inside a pair or interval, "(12,102)", is a separator.
_GROUPED_NUMBER = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?")


@dataclass(frozen=True)
class Verdict:
    """Outcome of one verification. ``reason`` is "" when correct."""

    correct: bool
    extracted: str | None
    reason: str


# --------------------------------------------------------------------------- extraction


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"answer extraction mode {mode!r} is not known; choose one of: {', '.join(MODES)}")


def _braced(text: str, open_at: int) -> str | None:
    """Content of the brace group opening at ``text[open_at] == '{'``, or None if unbalanced."""
    depth, i = 0, open_at
    while i < len(text):
        c = text[i]
        if c == "\\":  # \{ and \} are literal braces, \\ a line break: skip the escaped char
            i += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[open_at + 1 : i]
        i += 1
    return None


# what may stand between the boxes of one answer set: "\boxed{-2} \quad \text{and} \quad \boxed{1}"
_BOX_JOINER = re.compile(r"(?:\s|,|;|\$|\\quad|\\qquad|\\text\{\s*(?:and|or|,)?\s*\}|\band\b|\bor\b|\\[,;: ])*")


def _boxes(text: str) -> list[tuple[int, int, str]]:
    """(start, end, content) of every complete ``\\boxed{...}`` / ``\\fbox{...}`` in order
    (nested braces allowed; ``\\boxed 5``, no braces, is its single token); a truncated box
    (no closing brace) is left out."""
    starts = sorted(
        (m.start(), m.end())
        for cmd in _BOX_CMDS
        for m in re.finditer(re.escape(cmd) + r"(?![A-Za-z])", text)
    )
    out = []
    for start, end in starts:
        j = end
        while j < len(text) and text[j] == " ":
            j += 1
        if j < len(text) and text[j] == "{":
            inner = _braced(text, j)
            if inner is not None:
                out.append((start, j + len(inner) + 2, inner))
        elif j > end:  # "\boxed 5"
            m = re.match(r"[^\s$]+", text[j:])
            if m:
                out.append((start, j + m.end(), m.group(0)))
    return out


def _extract_boxed(text: str) -> str | None:
    """Content of the last complete ``\\boxed{...}`` / ``\\fbox{...}``; when the boxes before it are
    joined to it by nothing but spaces, commas, "and" / "or" and spacing commands, the whole run
    is one answer set: ``\\boxed{-2} \\quad \\text{and} \\quad \\boxed{1}`` is ``-2, 1``. A truncated
    last box is skipped in favour of the last complete one."""
    boxes = _boxes(text)
    if not boxes:
        return None
    run = [boxes[-1]]
    for prev in reversed(boxes[:-1]):
        gap = text[prev[1]:run[0][0]]
        if _BOX_JOINER.fullmatch(gap) is None:
            break
        run.insert(0, prev)
    return ", ".join(c for _, _, c in run) if len(run) > 1 else run[0][2]


def _extract_hash(text: str) -> str | None:
    """Text after the last ``####`` (GSM8K style): its leading number, else its first token."""
    at = text.rfind("####")
    if at < 0:
        return None
    rest = text[at + 4 :].strip().split("\n", 1)[0].strip()
    if not rest:
        return None
    rest = rest.replace("\\$", "").replace("$", "").strip()
    m = _NUMBER.match(rest)
    if m:
        return m.group(0)
    tok = rest.split()
    return tok[0] if tok else None


# math spans a completion may end its answer in: $...$, $$...$$, \(...\), \[...\]
_MATH_SPAN = re.compile(r"\$\$(.+?)\$\$|(?<!\\)\$(.+?)(?<!\\)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]", re.S)
_MATHY = re.compile(r"[\\^_{}\[\]()=]")  # a span body that holds math, not words between two dollar signs
# what, right beside a number, makes it part of a larger expression rather than an answer of its own
_ATTACHED_LEFT = tuple("^_{([|*/+\\") + ("\\cdot", "\\times", "\\sqrt", "\\pi")
_ATTACHED_RIGHT = tuple("^_})]|*/+-\\") + ("!",)


def _stands_alone(text: str, start: int, end: int) -> bool:
    """Whether the number text[start:end] is not an operand inside a larger expression (a
    fraction's part, an exponent, an interval's end, a term of a sum)."""
    left, right = text[:start].rstrip(), text[end:].lstrip()
    if left.endswith("(") and right.startswith(")") and not left[:-1][-1:].isalnum():
        return True  # a lone number in parentheses: "(5)"
    if left.endswith(_ATTACHED_LEFT) or (left.endswith("-") and not left.endswith((" -", "=-"))):
        return False
    if right.startswith(_ATTACHED_RIGHT) and not right.startswith(("-\n", "- ")):
        return False
    return True


def _extract_last_number(text: str) -> str | None:
    """The last number in the text (``1,000``, ``-3``, ``2.5``, ``3/4``, ``\\frac{3}{4}``), when it
    stands alone. When the text ends its answer in a math span (``$...$``, ``\\(...\\)``) the
    whole span is the answer, as math-verify reads it: a number is never pulled out of a larger
    expression (``$\\frac{1+\\sqrt{5}}{2}$`` is not ``2``, ``$-[0,1)$`` is not ``1``), and a number
    that is an operand of one outside a span is no answer (None: a miss, never a false match)."""
    best: tuple[int, int, str] | None = None
    for m in _NUMBER.finditer(text):
        best = (m.start(), m.end(), m.group(0))
    for m in _LATEX_FRAC.finditer(text):
        if best is None or m.end() > best[0]:
            sign = "-" if m.group(1) else ""
            best = (m.start(), m.end(), f"{sign}{m.group(2)}/{m.group(3)}")
    # the last math span, where it holds math (a $ pair around plain words is currency: "$18 and $20")
    spans = [m for m in _MATH_SPAN.finditer(text) if _MATHY.search(_span_body(m)) or
             _NUMBER.fullmatch(_span_body(m).strip())]
    if spans and (best is None or best[0] < spans[-1].end()):  # no number after it: the span is the answer
        return _span_body(spans[-1]).strip() or None
    if best is None:
        return None
    start, end, value = best
    return value if _stands_alone(text, start, end) else None


def _span_body(m: re.Match) -> str:
    return next(g for g in m.groups() if g is not None)


def normalize_answer(ans: str) -> str:
    """Surface clean-up shared by extracted and gold answers; never changes what an answer means.

    Drops dollar signs (``$`` and the escaped ``\\$``, which math-verify does not read past),
    thin spaces (``\\,`` ``\\;`` ``\\:`` ``\\!``, never the ``\\\\`` row break of a matrix), a
    ``\\text{...}`` wrapping the whole answer, one trailing sentence period, and the commas of an
    answer that is a single thousands-grouped number. Everything else (``\\left``, ``{,}``,
    ``\\dfrac``, units, degrees, percent) is left to math-verify's own LaTeX normalisation, which
    knows the context; string rewrites here saw none and changed meaning (a matrix cut to its
    first entry, ``(12,102)`` read as 12102).
    """
    s = ans.strip()
    s = s.replace("\\$", "").replace("$", "")
    s = _BACKSLASH_PAIR.sub(lambda m: "\\\\" if m.group(1) == "\\" else "", s)
    s = s.strip()
    m = _TEXT_WRAPPED.match(s)
    if m:
        s = m.group(1).strip()
    if s.endswith(".") and not s.endswith(".."):  # a sentence's full stop, not an ellipsis
        s = s[:-1].rstrip()
    elif s.endswith((",", ";")) and not s.endswith(("\\,", "\\;")):  # the sentence goes on after the answer
        s = s[:-1].rstrip()
    t = s.replace("{,}", ",")  # 1{,}000: the braces only stop LaTeX spacing after the comma
    if _GROUPED_NUMBER.fullmatch(t):
        s = t.replace(",", "")
    return s


def extract_answer(text: str, mode: str = "auto") -> str | None:
    """The final answer in ``text``, normalised, or None when there is none.

    Modes: ``boxed`` (last ``\\boxed{}`` / ``\\fbox{}``), ``hash`` (after the last ``####``),
    ``last_number``, ``auto`` (boxed, then hash, then last number).
    """
    _check_mode(mode)
    if not isinstance(text, str) or not text:
        return None
    order = {"auto": ("boxed", "hash", "last_number")}.get(mode, (mode,))
    for m in order:
        raw = {"boxed": _extract_boxed, "hash": _extract_hash, "last_number": _extract_last_number}[m](text)
        if raw is None:
            continue
        ans = normalize_answer(raw)
        if ans:
            return ans
    return None


# --------------------------------------------------------------------------- comparison


def _as_number(s: str) -> Fraction | None:
    """Exact value of a plain number / simple fraction string, else None."""
    t = s.replace(" ", "")
    m = re.fullmatch(r"(-?)\\[dt]?frac\{(-?\d+)\}\{(-?\d+)\}", t)
    if m:
        t = f"{m.group(1)}{m.group(2)}/{m.group(3)}".replace("--", "")
    try:
        if re.fullmatch(r"-?(\d+(\.\d*)?|\.\d+)(/-?\d+(\.\d*)?)?", t) is None:
            return None
        if "/" in t:
            num, den = t.split("/")
            return Fraction(num) / Fraction(den)
        return Fraction(t)
    except (ValueError, ZeroDivisionError):
        return None


def _group_before(t: str, i: int) -> str | None:
    """The parenthesised (or braced) group ending just before position ``i``, or None."""
    j = i - 1
    while j >= 0 and t[j] == " ":
        j -= 1
    if j < 0 or t[j] not in ")}]":
        return None
    close, opener = t[j], {")": "(", "}": "{", "]": "["}[t[j]]
    depth = 0
    for k in range(j, -1, -1):
        if t[k] == close:
            depth += 1
        elif t[k] == opener:
            depth -= 1
            if depth == 0:
                return t[k + 1:j]
    return None


def _too_costly(s: str) -> str | None:
    """Why ``s`` might make sympy compute an astronomically large number, or None.

    With math-verify's timeouts off nothing interrupts a parse, and a signal could not stop a
    single huge big-integer power anyway, so the known blow-ups are refused up front: towers of
    exponents (``2^{2^{10}}``, ``9^9^9``), literal exponents whose product passes 10^6 (which
    also catches ``((2^{999})^{999})^{999}``), powers over 200 of a group with a variable
    (``(x+1)^{3000}``, whose expansion sympy would compute), and factorials of anything but a
    literal up to 5000 or a symbol (``(10!)!``, ``10!!!``, ``100000!``).
    """
    t = s.replace("**", "^")
    budget = 1
    for m in re.finditer(r"\^\s*", t):
        j = m.end()
        if j < len(t) and t[j] == "{":
            expo = _braced(t, j) or t[j + 1 :]
        else:
            expo = re.match(r"[^\s+\-*/=)}\]]*", t[j:]).group(0)
            if t[j + len(expo) : j + len(expo) + 1] == "^":
                return "a tower of exponents"
        if "^" in expo or "!" in expo or "exp" in expo:
            return "a tower of exponents"
        digits = re.findall(r"\d+", expo)
        if any(len(d) > 6 for d in digits):
            return "an exponent over 6 digits"
        base = _group_before(t, m.start())
        if base is not None and re.search(r"[A-Za-z]", base) and max([int(d) for d in digits] + [0]) > 200:
            return "a power over 200 of an expression with a variable (expanding it is unbounded work)"
        budget *= max([int(d) for d in digits] + [1])
        if budget > 10**6:
            return "exponents whose product is over 10^6"
    for m in re.finditer(r"!", t):
        before = t[: m.start()].rstrip()
        if re.search(r"[A-Za-z]$", before):
            continue  # n! stays symbolic
        lit = re.search(r"(?<![\d.])(\d+)$", before)
        if lit is None or int(lit.group(1)) > 5000:
            return "a factorial of a large or compound value"
    return None


def _mv_parse_answer(s: str) -> tuple:
    return _mv_parse_cached(s, _timeout())


@lru_cache(maxsize=4096)
def _mv_parse_cached(s: str, timeout: int | None) -> tuple:
    """math-verify's parse of one answer string (cached: maj@n compares each answer many times).

    Wrapped in $...$ so the LaTeX extractor reads the whole string as one expression; math-verify
    then applies its own LaTeX normalisation (\\left, {,}, \\dfrac, units, degrees, ...).
    """
    parsed = _mv_parse(f"${s}$", parsing_timeout=timeout)
    if not parsed:
        parsed = _mv_parse(s, parsing_timeout=timeout)
    return tuple(parsed)


def _gold_answer(gold: str) -> str:
    """The gold answer string, normalised; a gold written as a solution is extracted first."""
    if "####" in gold or any(cmd in gold for cmd in _BOX_CMDS):
        got = extract_answer(gold, "auto")
        if got:
            return got
    return normalize_answer(gold)


@lru_cache(maxsize=65536)
def _compare(answer: str, reference: str) -> tuple[bool, str]:
    """Is the normalised ``answer`` equivalent to the normalised ``reference``? (ok, reason).

    Memoised: the samples of a prompt repeat the same answers, and maj@n compares each distinct
    answer with every class's representative, so one pair is compared (and parsed) once per
    process.

    Exact checks first (no parser, cannot hang); then math-verify with the reference as its gold,
    after refusing the inputs that could make it run unbounded.
    """
    if answer == reference:
        return True, ""
    xn, gn = _as_number(answer), _as_number(reference)
    if xn is not None and gn is not None:
        if xn == gn:
            return True, ""
        if xn.denominator == 1 and gn.denominator == 1:
            return False, "mismatch"
        # Decimals and fractions go on to math-verify, which accepts a decimal rounded to
        # 6 places (0.333333 for 1/3): the exact check alone would be stricter than it.

    if len(answer) > MAX_ANSWER_CHARS or len(reference) > MAX_ANSWER_CHARS:
        return False, f"mismatch (answer over {MAX_ANSWER_CHARS} characters, compared as text)"
    for side, value in (("gold", reference), ("extracted", answer)):
        why = _too_costly(value)
        if why:
            return False, f"parse error: the {side} answer holds {why}; not evaluated"
    try:
        gp = _mv_parse_answer(reference)
        xp = _mv_parse_answer(answer)
        if not gp or not xp:
            side, value = ("gold", reference) if not gp else ("extracted", answer)
            return False, f"parse error: math-verify could not parse the {side} answer {value!r}"
        ok = _mv_verify(list(gp), list(xp), timeout_seconds=_timeout())
    except Exception as e:  # math-verify / sympy on hostile input: incorrect, not a crash
        return False, f"parse error: {type(e).__name__}: {e}"
    return bool(ok), "" if ok else "mismatch"


def same_answer(answer: str, reference: str) -> bool:
    """Are two extracted answers mathematically equivalent (``\\frac{1}{2}`` and ``0.5``)?

    Both are normalised first; ``reference`` plays math-verify's gold. For grouping sampled
    answers (maj@n); an answer math-verify cannot parse only matches its own normalised text.
    """
    a, r = normalize_answer(answer), normalize_answer(reference)
    return bool(a) and bool(r) and _compare(a, r)[0]


def verify(completion: str, gold: str, mode: str = "auto") -> Verdict:
    """Is the answer extracted from ``completion`` (by ``mode``) equivalent to ``gold``?

    Never raises on a malformed completion or answer; an unknown ``mode`` is a ValueError.
    """
    _check_mode(mode)
    extracted = extract_answer(completion, mode)
    if extracted is None:
        return Verdict(False, None, "no answer found")
    if not isinstance(gold, str) or not gold.strip():
        return Verdict(False, extracted, f"parse error: gold answer is empty ({gold!r})")
    ok, why = _compare(extracted, _gold_answer(gold))
    return Verdict(ok, extracted, why)


def score_math(
    completions: list[str],
    golds: list[str],
    mode: str = "auto",
    correctness_bonus: float = 1.0,
    rm_scores: list[float] | None = None,
) -> list[float]:
    """Reward per completion: (reward-model score if given, else 0) + bonus * correct."""
    _check_mode(mode)
    if len(completions) != len(golds):
        raise ValueError(f"score_math: {len(completions)} completions but {len(golds)} gold answers")
    if rm_scores is not None and len(rm_scores) != len(completions):
        raise ValueError(f"score_math: {len(completions)} completions but {len(rm_scores)} rm_scores")
    out = []
    for i, (c, g) in enumerate(zip(completions, golds)):
        base = float(rm_scores[i]) if rm_scores is not None else 0.0
        out.append(base + correctness_bonus * float(verify(c, g, mode).correct))
    return out
