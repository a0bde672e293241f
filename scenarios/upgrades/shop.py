"""The ``upgrade_shop`` workload and its builds: what each kind of change between the
build that crashed and the build that resumes does to an in-flight run.

The agent (build ``shop-v1``): ``hold`` (a read-only tool that puts a :class:`Cart` and
the ``shipping`` address on the run's state) -> ``charge`` (the cart's total) ->
``send_receipt`` (a mail whose body names the cart and the address, read from the
state) -> answer. Every build below is the same agent after one change, a subject of
its own (``crashmatrix run upgrade_shop --subject shop-v1 --resume-with shop-renamed``);
docs/findings.md ("Two builds") has what each pair's matrix says:

| build | the change | expected |
| --- | --- | --- |
| ``shop-renamed`` | the state class ``Cart`` is renamed ``Basket`` | passes: the state codec keys fields by name and a registered codec, never by class path |
| ``shop-folded`` | ``shipping`` moves into the cart (schema 2, upgrader 1 -> 2) | passes: the upgrader folds old states on read |
| ``shop-dropped`` | ``shipping`` is dropped, no upgrader | a run that crashed with a state parks ``cannot_migrate``, the reason named (``upgrade.migrated`` valid; ``run.status`` and the rest fail) |
| ``shop-review`` | a model call (an address check) is added before the charge | the resumed run differs from the golden run: ``transcript.exact``, ``model.calls_billed``, ``effects.ledger_equal`` |

The changes are made to the agent the workload builds (:func:`agent_for`), by the
build's adapter (:class:`ShopBuild`), in the build's own worker processes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import anyio

from crashmatrix.harness.adapters.reference import ReferenceAdapter
from crashmatrix.reference_runtime.agent import Agent, Tool, ToolContext, ToolOutcome
from crashmatrix.reference_runtime.state_codec import FieldCodec, StateSchema

from .._workload import ScriptedWorkload
from ..checkout import ScriptedModel
from ..checkout.script import CARDS, CUSTOMER, _call, _tool_results
from ..checkout.tools import CATALOGUE, charge, probe_charge, probe_mail, send_receipt

NAME = "upgrade_shop"
SCRIPT = "crashmatrix.scenarios.upgrades.shop:respond"
SCRIPT_WITH_REVIEW = "crashmatrix.scenarios.upgrades.shop:respond_with_review"
SHIP_TO = "Ada Lovelace, 12 Analytical Row, London"


@dataclass
class Cart:
    """Build 1's cart on the state."""

    sku: str
    qty: int
    total: int


@dataclass
class Basket:
    """Build ``shop-renamed``'s cart: the same fields, another class name."""

    sku: str
    qty: int
    total: int


@dataclass
class FoldedCart:
    """Build ``shop-folded``'s cart: the shipping address moved in."""

    sku: str
    qty: int
    total: int
    ship_to: str


def _cart_codec(cls: type) -> FieldCodec:
    return FieldCodec(encode=lambda c: {k: getattr(c, k) for k in cls.__dataclass_fields__},
                      decode=lambda d: cls(**d))


def schema_v1(cart_class: type = Cart) -> StateSchema:
    s = StateSchema("shop", version=1)
    s.field("cart", _cart_codec(cart_class))
    s.field("shipping")
    return s


def schema_folded(with_upgrader: bool) -> StateSchema:
    """Schema 2: ``shipping`` inside the cart; ``with_upgrader``: the upgrader from 1."""
    s = StateSchema("shop", version=2)
    s.field("cart", _cart_codec(FoldedCart))
    if with_upgrader:
        @s.upgrader(1)
        def fold(fields: dict[str, Any]) -> dict[str, Any]:
            cart = dict(fields.get("cart") or {})
            if "shipping" in fields:
                cart["ship_to"] = fields.pop("shipping")
            return {**fields, "cart": cart} if cart else fields
    return s


async def hold(ctx: ToolContext, args: dict[str, Any], *, cart_class: type = Cart, folded: bool = False) -> ToolOutcome:
    """Put the cart (and the address) on the state; read-only towards providers."""
    await anyio.lowlevel.checkpoint()
    item = CATALOGUE[args["sku"]]
    total = item["price"] * args["qty"]
    if folded:
        ctx.state["cart"] = FoldedCart(item["sku"], args["qty"], total, args["ship_to"])
    else:
        ctx.state["cart"] = cart_class(item["sku"], args["qty"], total)
        ctx.state["shipping"] = args["ship_to"]
    return ToolOutcome("succeeded", {"sku": item["sku"], "qty": args["qty"], "total": total, "currency": "eur"})


def _address(state: dict[str, Any]) -> str:
    cart = state["cart"]
    return getattr(cart, "ship_to", None) or state["shipping"]


async def receipt(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    """The receipt mail, its body from the state (cart and address)."""
    cart = ctx.state["cart"]
    body = f"{args['body']} {cart.qty} x {cart.sku} ({cart.total} cents), shipping to {_address(ctx.state)}."
    return await send_receipt(ctx, {**args, "body": body})


async def check_address(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    await anyio.lowlevel.checkpoint()
    return ToolOutcome("succeeded", {"address": args["address"], "deliverable": True})


def respond(conversation: str, messages: list[dict[str, Any]], *, review: bool = False) -> dict[str, Any]:
    """The shop agent (runs in the model provider); ``review``: build ``shop-review``'s,
    which checks the address before it charges."""
    holds = _tool_results(messages, "hold")
    if not holds:
        return {"content": "Holding a dock for you.", "tool_calls": [_call("hold", sku="dock-1", qty=1, ship_to=SHIP_TO)]}
    total = holds[0]["content"]["total"]
    if review and not _tool_results(messages, "check_address"):
        return {"content": "Checking the address first.", "tool_calls": [_call("check_address", address=SHIP_TO)]}
    charges = _tool_results(messages, "charge")
    if not charges:
        return {"content": f"Paying {total} cents.", "tool_calls": [_call("charge", amount=total, currency="eur",
                                                                           card=CARDS[1])]}
    charge_id = charges[-1]["content"]["charge_id"]
    if not _tool_results(messages, "send_receipt"):
        return {"content": "Sending the receipt.", "tool_calls": [_call(
            "send_receipt", to=CUSTOMER, subject="Your order", body=f"Charge {charge_id}:")]}
    return {"content": f"Done: charged {charge_id}, receipt sent.", "tool_calls": []}


def respond_with_review(conversation: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    return respond(conversation, messages, review=True)


BUILDS = ("shop-v1", "shop-renamed", "shop-folded", "shop-dropped", "shop-review")


def agent_for(build: str, resources: Any) -> Agent:
    """The shop agent as build ``build`` (:data:`BUILDS`) has it. Raises ``KeyError``."""
    if build not in BUILDS:
        raise KeyError(f"build={build!r} is not one of {', '.join(BUILDS)}")
    cart_class = Basket if build == "shop-renamed" else Cart
    folded = build in ("shop-folded", "shop-dropped")

    async def hold_tool(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        return await hold(ctx, args, cart_class=cart_class, folded=folded)

    tools = {
        "hold": Tool("hold", hold_tool),
        "charge": Tool("charge", charge, effect=True, probe=probe_charge),
        "send_receipt": Tool("send_receipt", receipt, effect=True, probe=probe_mail),
    }
    if build == "shop-review":
        tools["check_address"] = Tool("check_address", check_address)
    schema = (schema_folded(with_upgrader=build == "shop-folded") if folded else schema_v1(cart_class))
    script = SCRIPT_WITH_REVIEW if build == "shop-review" else SCRIPT
    return Agent(NAME, ScriptedModel(resources, script), tools, resources=resources, state_schema=schema)


class ShopWorkload(ScriptedWorkload):
    """See the module docstring; :meth:`build_agent` is build ``shop-v1``'s agent."""

    name = NAME
    conversations = ("buy",)
    providers = ("payment", "mail", "model")
    request = "Buy a USB-C dock and ship it to Ada."

    def build_agent(self, conversation: str, resources: Any) -> Agent:
        self.check_conversation(conversation)
        return agent_for("shop-v1", resources)


WORKLOAD = ShopWorkload()


class ShopBuild(ReferenceAdapter):
    """The reference runtime running the shop agent as build :attr:`build` has it."""

    build = "shop-v1"

    def make_runtime(self, db: Any, agent: Agent, ctx: Any) -> Any:
        return super().make_runtime(db, agent_for(self.build, agent.resources), ctx)


def _build(name: str) -> type[ShopBuild]:
    cls = type(f"Shop{name.split('-', 1)[1].capitalize()}Build", (ShopBuild,), {
        "build": name, "name": name, "__module__": __name__,
        "__doc__": f"The reference runtime with the shop agent of build {name} (module docstring)."})
    cls.__qualname__ = cls.__name__
    globals()[cls.__name__] = cls
    return cls


SHOP_BUILDS: dict[str, type[ShopBuild]] = {name: _build(name) for name in BUILDS}
"""Build name -> its adapter class (``ShopV1Build``, ``ShopRenamedBuild``, ...)."""
