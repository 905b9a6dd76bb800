"""The shapes of the dicts dpfusion returns (accuracy, charge, plans, budget), as TypedDicts.

Run by the extension when it is imported (lib.rs), and its classes added to the `dpfusion` module, so that
`dpfusion.Charge` and the others exist at run time as they do in the type stubs (dpfusion.pyi, which repeats them;
tests/test_typing.py checks both against each other and against the dicts the calls return).
"""

from typing import Any, Literal, Optional, TypedDict


class _AccuracyKind(TypedDict):
    kind: Literal["public", "noisy", "combined", "per_row", "rank", "no_interval"]


class ColumnAccuracy(_AccuracyKind, total=False):
    """How far off one column of a release may be (`Release.accuracy[column]`): `kind` always; the other keys as
    the kind has them (`noisy`: `mechanism`, `sigma_or_scale`, `std`, `ci_half_width`, `confidence`; `combined`:
    `ci_half_width`, `confidence`, `measurements`; `per_row`: `confidence`, `intervals`; `rank`: `mechanism`,
    `rank_half_width`, `confidence`, `quantile`, `candidates`, `spacing`; `no_interval`: `reason`).

    >>> a: dpfusion.ColumnAccuracy = s.sql("SELECT COUNT(*) AS n FROM pums").accuracy["n"]
    >>> a["kind"], a["ci_half_width"]
    ('noisy', 12.0)
    """

    mechanism: str
    sigma_or_scale: float
    std: float
    ci_half_width: float
    confidence: float
    measurements: int
    intervals: list[list[float]]
    rank_half_width: float
    quantile: float
    candidates: int
    spacing: float
    reason: str


class _ChargeKeys(TypedDict):
    id: Optional[int]
    rho: float
    epsilon: float
    delta: float


class Charge(_ChargeKeys, total=False):
    """What one query cost (`Release.charge`): `id` (the ledger's charge; None for a query over public tables only),
    `rho`, and `epsilon` at `delta`; `free` (True) when it spent nothing (answered from an earlier charge, or
    public); `selection_delta` when it selected GROUP BY keys.

    >>> c: dpfusion.Charge = s.sql("SELECT COUNT(*) AS n FROM pums").charge
    >>> c["id"], round(c["rho"], 9)
    (1, 0.05)
    """

    free: bool
    selection_delta: float


class _ReleaseBudgetKeys(TypedDict):
    rho_total: float
    rho_spent: float
    rho_remaining: float
    epsilon: float
    delta: float


class ReleaseBudget(_ReleaseBudgetKeys, total=False):
    """The budget after one query (`Release.budget`): ρ in all, spent and remaining, and the ε of what was spent at
    `delta`; `delta_remaining` when the query selected GROUP BY keys.

    >>> b: dpfusion.ReleaseBudget = s.sql("SELECT COUNT(*) AS n FROM pums").budget
    >>> round(b["rho_remaining"], 9)
    0.95
    """

    delta_remaining: float


class Budget(TypedDict):
    """The session's budget (`Session.budget()`): ρ in all, spent and remaining, ε of what was spent at `delta`,
    how many `charges`, and the δ budget of key selections (`delta_total`, `delta_spent`, `delta_remaining`).

    >>> b: dpfusion.Budget = s.budget()
    >>> b["rho_total"], b["charges"]
    (1.0, 0)
    """

    rho_total: float
    rho_spent: float
    rho_remaining: float
    epsilon: float
    delta: float
    charges: int
    delta_total: float
    delta_spent: float
    delta_remaining: float


class HistoryEntry(TypedDict):
    """One charge of the budget (`Session.history()`): `id`, `label` (the SQL), `rho`, `measurements`.

    >>> _ = s.sql("SELECT COUNT(*) AS n FROM pums")
    >>> h: dpfusion.HistoryEntry = s.history()[0]
    >>> h["id"], h["measurements"]
    (1, 1)
    """

    id: int
    label: str
    rho: float
    measurements: int


class Setting(TypedDict):
    """What `SET dp.<option> = <value>` set (`Session.sql` returns it): the option and its new value, as text.

    >>> s.sql("SET dp.confidence = 0.9")
    {'option': 'dp.confidence', 'value': '0.9'}
    """

    option: str
    value: str


class MarginalCharge(TypedDict):
    """What one-way marginals cost (`MarginalRelease.charge`): the ledger's charge `id` and its `rho`.

    >>> c: dpfusion.MarginalCharge = s.marginals("pums", ["sex"], rho=0.05).charge
    >>> c["id"]
    1
    """

    id: int
    rho: float


class WorkloadCharge(TypedDict):
    """What a workload cost (`WorkloadRelease.charge`): `id` and `rho` of the charge that paid, and `reused_from`
    (that charge's id when an earlier release of the same workload answered it, else None).

    >>> c: dpfusion.WorkloadCharge = s.workload("pums", ["sex", "race"], rho=0.05).charge
    >>> c["reused_from"] is None
    True
    """

    id: int
    rho: float
    reused_from: Optional[int]


class Epsilon(TypedDict):
    """An (ε, δ) bound (`MarginalPlan["epsilon"]`, `WorkloadPlan["epsilon"]`): `epsilon` at `delta`, and `kind`, the
    conversion that gave it (e.g. `cks20`).

    >>> e: dpfusion.Epsilon = s.marginals("pums", ["sex"], rho=0.05).plan["epsilon"]
    >>> e["delta"], e["kind"]
    (1e-06, 'cks20')
    """

    epsilon: float
    delta: float
    kind: str


class _MarginalPlanKeys(TypedDict):
    d: int
    rows_per_unit: int
    cells: int
    l2_sensitivity: float
    rho: float
    sigma: float
    std: float
    ci_half_width: float
    max_error: float
    confidence: float
    sigma_frequency: Optional[float]
    epsilon: Epsilon


class MarginalPlan(_MarginalPlanKeys, total=False):
    """The noise and accuracy of one-way marginals (`MarginalRelease.plan`): `d` columns, `cells`, the L2
    sensitivity, `rho`, `sigma`, each cell's `std` and `ci_half_width`, `max_error` (all cells at once),
    `confidence`, `epsilon`, and `selection` when keys were selected.

    >>> p: dpfusion.MarginalPlan = s.marginals("pums", ["sex", "race"], rho=0.05).plan
    >>> p["d"], p["cells"]
    (2, 8)
    """

    selection: dict[str, Any]


class WorkloadSet(TypedDict):
    """One marginal of a workload's plan (`WorkloadPlan["sets"]`): its `columns`, `cells`, `std`, `ci_half_width`.

    >>> w: dpfusion.WorkloadSet = s.workload("pums", ["sex", "race"], rho=0.05).plan["sets"][0]
    >>> w["columns"], w["cells"]
    (['sex', 'race'], 12)
    """

    columns: list[str]
    cells: int
    std: float
    ci_half_width: float


class WorkloadResidual(TypedDict):
    """One residual of a workload's plan (`WorkloadPlan["residuals"]`): `columns`, `contrasts`, `rho`, `sigma`.

    >>> r: dpfusion.WorkloadResidual = s.workload("pums", ["sex", "race"], rho=0.05).plan["residuals"][0]
    >>> r["columns"]
    []
    """

    columns: list[str]
    contrasts: int
    rho: float
    sigma: float


class WorkloadPlan(TypedDict):
    """The noise and accuracy of a workload (`WorkloadRelease.plan`): per marginal (`sets`), per residual
    (`residuals`), `rows_per_unit`, `rho`, `epsilon`, `confidence`, and the sum of every cell's variance (`total_variance`) beside
    the optimum for that ρ and answering each marginal alone (`optimal_variance`, `one_by_one_variance`); what the
    allocation minimised (`loss`), the largest variance of a cell and, for `loss = "max"`, the lower bound on it
    that the allocation certifies (`largest_variance_bound`, else None), and the memory the release holds at most
    (`memory_bytes`, known before any read).

    >>> p: dpfusion.WorkloadPlan = s.workload("pums", ["sex", "race"], rho=0.05).plan
    >>> len(p["sets"]), len(p["residuals"])
    (1, 4)
    """

    sets: list[WorkloadSet]
    residuals: list[WorkloadResidual]
    rows_per_unit: int
    rho: float
    epsilon: Epsilon
    confidence: float
    total_variance: float
    optimal_variance: float
    one_by_one_variance: float
    loss: Literal["sum", "max"]
    largest_variance: float
    largest_variance_bound: Optional[float]
    memory_bytes: int
