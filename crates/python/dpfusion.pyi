"""Type stubs of the `dpfusion` extension module (maturin ships them with py.typed). See README.md."""

from os import PathLike
from typing import Any, Optional, Sequence, Union

__version__: str

def split_statements(text: str) -> list[str]:
    """The statements of a SQL script, split on `;` outside quotes and comments (as `dpfusion query -f` does)."""
    ...

class Error(Exception):
    """Any dpfusion error: `.code` names its kind, `.hint` says what to change (may be empty)."""

    code: str
    hint: str

class Refused(Error):
    """The query cannot be answered under the policy; nothing was spent. Carries no private value."""

class BudgetExhausted(Refused):
    """The query costs more than what remains (of the budget or a table's cap); nothing was spent."""

class Release:
    """The noisy answer to one query, debited before it was computed."""

    accuracy: dict[str, dict[str, Any]]
    charge: dict[str, Any]
    budget: dict[str, float]
    sql: str
    note: Optional[str]
    columns: list[str]
    def to_arrow(self) -> Any: ...
    def to_pandas(self) -> Any: ...
    def to_polars(self) -> Any: ...
    def __len__(self) -> int: ...
    def _repr_html_(self) -> str: ...

class Explanation:
    """EXPLAIN DP: what a query would do and cost; nothing read or spent. `str()` is the report."""

    rho: float
    epsilon: float
    delta: float
    outputs: list[tuple[str, str]]

class MarginalRelease:
    """One-way marginals released in one debit."""

    plan: dict[str, Any]
    total: float
    charge: dict[str, Any]
    def to_arrow(self) -> Any: ...
    def to_pandas(self) -> Any: ...

class Session:
    """A differentially private SQL session over private tables, with its budget. Thread-safe."""

    def __init__(self, config: Union[str, PathLike[str]]) -> None: ...
    @staticmethod
    def from_policy(policy: dict[str, Any]) -> Session: ...
    def sql(self, sql: str, request_id: Optional[str] = None) -> Union[Release, Explanation, None]: ...
    def explain(self, sql: str) -> Explanation: ...
    def budget(self) -> dict[str, float]: ...
    def history(self) -> list[dict[str, Any]]: ...
    def tables(self) -> dict[str, list[str]]: ...
    def register(self, name: str, data: Any, policy: dict[str, Any]) -> None: ...
    def marginals(
        self,
        table: str,
        columns: Sequence[str],
        *,
        rho: Optional[float] = None,
        target_std: Optional[float] = None,
        consistency: bool = True,
        confidence: Optional[float] = None,
    ) -> MarginalRelease: ...
