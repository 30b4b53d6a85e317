"""transformWithState's stores as its operator's metadata lists them: one per state
variable, and one of its timers.

Why a module of its own: the layout names a transformWithState operator's stores after
its state variables (``layout``), and reading a store (``transform``) needs the variable
it serves; the list is read here, below both, so the layout never needs the reader.

What the metadata says (Spark 4.0 to 4.3): ``state/<op>/_metadata/v2/<batch>``'s
``operatorPropertiesJson`` lists the state variables, ``{"stateName",
"stateVariableType": "ValueState" | "ListState" | "MapState" | "TimerState",
"ttlEnabled"}``; the timers are listed by their column family's name,
``$procTimers_keyToTimestamp`` (processing time) or ``$eventTimers_keyToTimestamp``
(event time), and served as one store, ``$timers``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .codecs import StateFileError
from .state_schema import OperatorMetadata

__all__ = [
    "KINDS",
    "LIST",
    "MAP",
    "OPERATORS",
    "TIMER",
    "TIMERS",
    "VALUE",
    "StateVariable",
    "not_supported",
    "store_variables",
    "variable_of",
]

#: The operator names Spark records for transformWithState and its Python variants.
OPERATORS = frozenset(
    {"transformWithStateExec", "transformWithStateInPandasExec", "transformWithStateInPySparkExec"}
)
#: The store suffix of the timers (a name no state variable can have: Spark reserves "$").
TIMERS = "$timers"
VALUE, LIST, MAP, TIMER = "ValueState", "ListState", "MapState", "TimerState"
#: The variable types iqkit serves (every type Spark 4.3 has).
KINDS = (VALUE, LIST, MAP, TIMER)


@dataclass(frozen=True)
class StateVariable:
    """One served store of the operator: a state variable, or the timers (``family`` is
    then the timers' column family)."""

    name: str
    kind: str
    family: str
    ttl: bool = False


def store_variables(metadata: OperatorMetadata) -> list[StateVariable]:
    """The operator's stores, one per state variable its metadata lists (a type iqkit
    does not know too: listed, and refused when read), and ``$timers`` where it has
    timers; empty when its metadata lists none (v1 metadata, a damaged file)."""
    listed = metadata.properties.get("stateVariables")
    out: list[StateVariable] = []
    for item in listed if isinstance(listed, list) else ():
        if not isinstance(item, dict) or not isinstance(item.get("stateName"), str):
            continue
        name, kind = item["stateName"], str(item.get("stateVariableType"))
        if kind == TIMER:
            if name.endswith("Timers_keyToTimestamp"):
                out.append(StateVariable(TIMERS, TIMER, name))
            continue
        out.append(StateVariable(name, kind, name, bool(item.get("ttlEnabled"))))
    return out


def variable_of(metadata: OperatorMetadata, name: str | None) -> StateVariable:
    """The variable ``name`` of the operator (``StateFileError`` if its metadata lists
    none)."""
    for variable in store_variables(metadata):
        if variable.name == name:
            return variable
    raise StateFileError(f"{metadata.source}: lists no state variable {name!r}")


def not_supported(metadata: OperatorMetadata, variable: str | None, store: str) -> str | None:
    """Why iqkit does not serve the store ``store`` (serving ``variable``) of a
    transformWithState operator (one line), or ``None``."""
    if variable is None:
        return (
            f"not supported yet: {metadata.operator_name} whose metadata "
            f"({metadata.source}) lists no state variables, store {store!r}"
        )
    kind = variable_of(metadata, variable).kind
    if kind not in KINDS:
        return (
            f"not supported yet: a {kind} state variable of {metadata.operator_name}, "
            f"store {store!r}"
        )
    return None
