"""The reference broker's registration of campaigns, the nodes of the tree of envelopes
(SPEC §3, §14.1), and their changes and removals (SPEC §14.9). A mixin of
:class:`~bursarcore.reference.broker.ReferenceBroker`."""

from __future__ import annotations

import json
import math

from ..admission.envelope import Envelope
from ..admission.paths import (EnvelopeFigures, change_budget, envelope_figures,
                               flow_unchanged)
from ..errors import InvalidArgument
from .core import BrokerCore
from .leases import Campaign, Holding
from . import tree
from .rules import CREDIT, NS, UNLIMITED

__all__ = ["BrokerNodes"]


class BrokerNodes(BrokerCore):
    """Registration, change and removal of the reference broker's campaigns."""

    def register(self, name: str, envelope: Envelope) -> int:
        """SPEC §3, §14: add a campaign, a node of the tree of envelopes (its parent is
        named by its path and must be registered); guarantees are never overbooked (Σ of
        a node's children's g ≤ its g, Σ of the top-level g ≤ capacity), and a new
        guarantee must fit beside the holdings above guarantees now (the reserve rule:
        Σ_top R stays ≤ capacity; and it lifts no load on its parent's path above that
        node's sustained rate)."""
        try:
            return self._register(name, envelope)
        finally:
            self._end_op()

    def _register(self, name: str, envelope: Envelope) -> int:
        if not isinstance(name, str) or not name:
            raise InvalidArgument("name", "must be a non-empty string", name)
        if name in self._cindex:
            raise InvalidArgument("name", "is already registered", name)
        parent = tree.check_name(name, self._cindex)                     # SPEC §14
        borrow, lend, g, s, b, buckets, budget = self._figures(envelope)
        t = self._now()
        for i, d in enumerate(self.dims):                                 # SPEC §3, §14
            tree.check_guarantee(self._camps, self._dim[i].cap, parent, i, g[i],
                                 f"guaranteed[{d}]")
        payload = self._jw.register_payload(name, envelope) if self._jw is not None else None
        self._advance(t)
        if self.flow is not None:
            fd = [d for d in self.flow_dims if d in envelope.dims()]
            self.flow.add_campaign(
                guaranteed={d: envelope.g(d) for d in fd}, sustained={d: envelope.s(d) for d in fd},
                ceiling={d: envelope.b(d) for d in fd}, burst={d: envelope.B(d) for d in fd},
                now=t / NS)
        if parent is not None:
            # SPEC §14.2: the new child's guarantee enters the loads on its parent's path
            for i in range(len(self.dims)):
                self._settle_path(self._camps[parent], i, t)
        c = len(self._camps)
        # SPEC §3: share defaults to g on the primary held dimension, or 1 when that is 0
        share = envelope.share if envelope.share is not None else (g[0] if g[0] > 0 else 1)
        hold = [Holding(g[i], s[i], b[i], buckets[i], buckets[i], t, borrow=borrow[i],
                        lend=lend[i]) for i in range(len(self.dims))]
        w = self._weight(t)
        path = [c] + ([] if parent is None else self._camps[parent].path)
        self._camps.append(Campaign(c, name, envelope.service_class, float(share), budget,
                                    hold, parent=parent, path=path, fs_S=0.0, fs_G=w))
        if parent is not None:
            self._camps[parent].children.append(c)
            for i in range(len(self.dims)):
                self._reload(i)
        self._cindex[name] = c
        self.envelopes[name] = envelope
        if self._jw is not None:
            self._jw.register(t, c, payload)
        return c

    def change(self, name: str, envelope: Envelope) -> None:
        """SPEC §14.9: replace a registered node's envelope. Its new guarantee nests (its
        children's within it, it with its siblings' within its parent's or the pool's
        capacity), a raise fits beside the holdings above guarantees now and lifts no load
        on its parent's path above that node's sustained rate (as a new child of the raise
        would), the budget changes between finite values only (never leaving credits left
        below 0), a bucket is settled and clipped to its new size. Live leases keep
        running as granted."""
        try:
            self._change(name, envelope)
        finally:
            self._end_op()

    def _change(self, name: str, envelope: Envelope) -> None:
        camp = self._camps[self.campaign_index(name)]
        c = camp.index
        borrow, lend, g, s, b, buckets, budget = self._figures(envelope)
        t = self._now()
        old = self.envelopes[name]
        flow_unchanged(old, envelope, self.flow_dims)
        for i, d in enumerate(self.dims):                                 # SPEC §14.9
            tree.check_change(self._camps, self._dim[i].cap, c, i, g[i], f"guaranteed[{d}]")
        credits = envelope.credits
        old_budget = UNLIMITED if math.isinf(old.credits) else round(old.credits * CREDIT)
        change_budget(old.credits, credits, old_budget, budget, camp.left)
        payload = self._jw.register_payload(name, envelope) if self._jw is not None else None
        self._advance(t)
        for i in range(len(self.dims)):
            self._settle_path(camp, i, t)
            h = camp.hold[i]
            h.g, h.s, h.b, h.B = g[i], s[i], b[i], buckets[i]
            h.T = min(h.T, h.B)
            h.borrow, h.lend = borrow[i], lend[i]
        if not camp.unlimited:
            camp.left += budget - old_budget
        camp.service_class = envelope.service_class
        camp.share = float(envelope.share if envelope.share is not None
                           else (g[0] if g[0] > 0 else 1))
        for i in range(len(self.dims)):
            self._reload(i)
        self.envelopes[name] = envelope
        if self._jw is not None:
            self._jw.change(t, c, payload)

    def remove(self, name: str) -> None:
        """SPEC §14.9: remove a node with no children, no live leases and no pending
        intents. Its guarantee leaves the figures as a change of it to 0 would (it stays in
        its parent's children, guaranteed 0, holding nothing, so that every definition
        reads as if it were gone, its past usage still counting in its parent's subtree);
        its index is never reused and its name may be registered again."""
        try:
            self._remove(name)
        finally:
            self._end_op()

    def _remove(self, name: str) -> None:
        camp = self._camps[self.campaign_index(name)]
        t = self._now()
        self._advance(t)
        if any(not self._camps[ch].removed for ch in camp.children):
            raise InvalidArgument("name", "has children: remove them first", name)
        if any(x.campaign == camp.index for x in self._leases.live()):
            raise InvalidArgument("name", "has live leases (starting, active or revoking): "
                                  "remove it when they end", name)
        if self._queue.of_campaign(camp.index):
            raise InvalidArgument("name", "has pending intents: remove it when they are "
                                  "decided or cancelled", name)
        for i in range(len(self.dims)):
            self._settle_path(camp, i, t)
            h = camp.hold[i]
            h.g, h.borrow, h.lend = 0, 0, 0
        camp.share = 0.0
        camp.removed = True
        for i in range(len(self.dims)):
            self._reload(i)
        del self._cindex[name]
        del self.envelopes[name]
        if self._jw is not None:
            self._jw.remove(t, camp.index, json.dumps({"name": name}, sort_keys=True))

    def _figures(self, envelope: Envelope) -> EnvelopeFigures:
        """An envelope's figures in engine units, checked against this broker's pool and
        classes (SPEC §3, §14.8)."""
        return envelope_figures(envelope, self._cls_index, self._dim_index, self._flow_index,
                                UNLIMITED)
