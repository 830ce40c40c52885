"""The reason codes and the rules with a limit (SPEC §4.4) are declared once for the core,
in its public header; the policy layer, the journal and the reference agree with it."""

from __future__ import annotations

import pytest

from bursarcore import Broker, Envelope, Intent, ManualClock, Pool, _abi
from bursarcore.admission import state
from bursarcore.journal import MemoryJournal, records
from bursarcore.reference import rules


def test_the_reference_names_the_headers_codes_in_the_headers_order():
    # the reference is written from the spec, apart from the header: they must agree
    assert rules.REASONS == _abi.REASONS
    assert rules.LIMIT_RULES == _abi.LIMITS
    assert (rules.OK, rules.CAPACITY, rules.TOKENS, rules.CREDITS, rules.CEILING) == tuple(
        _abi.REASONS.index(r) for r in ("", "capacity", "tokens", "credits", "ceiling"))


def test_the_policy_layer_and_the_journal_take_the_headers_codes():
    assert state.REASONS == _abi.REASONS
    assert [state.REASONS[c] for c in state.LIMIT_REASONS] == list(state.LIMITS)
    assert state.LIMITS[state.LIM_CAPACITY] == "capacity"
    assert state.REASONS[state.PENDING_LIMIT] == "pending_limit"
    lim_fields = [f for f in records.RECORD_DTYPE.names if f.startswith("lim_")]
    assert lim_fields == list(records.LIMIT_FIELDS) == [f"lim_{name}" for name in _abi.LIMITS]


def test_a_new_code_in_the_header_is_read_without_another_edit():
    text = """
    enum {
        BC_REASON_NONE = 0,
        BC_REASON_CAPACITY = 1,
        BC_REASON_QUOTA = 2,
        BC_REASONS = 3
    };
    enum {
        BC_LIMIT_CAPACITY = 0,
        BC_LIMIT_QUOTA = 1,
        BC_LIMITS = 2
    };
    """
    assert _abi._enum(text, "BC_REASON") == ("none", "capacity", "quota")
    assert _abi._enum(text, "BC_LIMIT") == ("capacity", "quota")


def test_a_header_with_a_gap_in_its_codes_is_refused():
    with pytest.raises(ImportError, match="BC_REASON"):
        _abi._enum("BC_REASON_NONE = 0,\nBC_REASON_X = 2,\n", "BC_REASON")


@pytest.mark.parametrize("burst, rule", [(100, "ceiling"), (4, "tokens")])
def test_each_rules_limit_is_journaled_and_explained(eb, burst, rule):
    # a request of 20 over 1 s: the ceiling allows 16 more; the tokens pay for the 8 of the
    # sustained rate and one more unit per unit-second in the bucket
    b = Broker(Pool(gpu=64), clock=ManualClock(0.0), backend=eb, journal=MemoryJournal())
    b.register("c", Envelope(credits=100, sustained={"gpu": 8}, ceiling={"gpu": 16},
                             burst={"gpu": burst}))
    d = b.acquire(Intent("c", units={"gpu": (1, 20)}, duration=1.0))
    rec = b.journal.record(d.seq)
    lims = {name: rec[f"lim_{name}"] for name in _abi.LIMITS}
    assert lims["ceiling"] == 16 and lims["tokens"] >= min(8 + burst, 16)
    assert lims["capacity"] == 64 and lims["credits"] >= 16
    assert d.outcome == "granted" and d.units == min(16, 8 + burst)
    assert min(lims, key=lambda r: lims[r]) == rule
    assert {"ceiling": "the ceiling binds", "tokens": "token bucket binds"}[rule] in \
        b.explain(d.seq).split("sized down:")[1]
