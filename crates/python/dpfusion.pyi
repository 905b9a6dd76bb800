"""Differentially private SQL on Apache DataFusion: `Session` opens private tables under their policies and a
privacy budget; `Session.sql` answers a query with a noisy `Release` (Arrow, pandas, polars), debited before any
private row is read. Two datasets are neighbours when one is the other with all rows of one privacy unit added
or removed; every guarantee is stated under that relation.

The examples of this package's docstrings run from the root of the dpfusion checkout (its demo configuration
`config/pums.toml`: real PUMS microdata, ρ = 1.0 in all, 0.05 per query), each in a fresh session `s`:

>>> import dpfusion
>>> s = dpfusion.Session("config/pums.toml")
>>> r = s.sql("SELECT sex, COUNT(*) AS n FROM pums GROUP BY sex ORDER BY sex")
>>> r.columns, len(r)
(['sex', 'n'], 2)
"""

from datetime import date, datetime
from os import PathLike
from typing import Any, Literal, Mapping, Optional, TypedDict, Sequence, Union

__version__: str

#: A value `Session.sql(..., params=...)` binds to a placeholder.
ParamValue = Union[None, bool, int, float, str, bytes, date, datetime]
#: `params=`: a list (or tuple) for `?` or `$1` placeholders, a dict for `$name` placeholders.
Params = Union[list[ParamValue], tuple[ParamValue, ...], Mapping[str, ParamValue]]

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


def split_statements(text: str) -> list[str]:
    """The statements of a SQL script, split on `;` outside quotes and comments, as the `dpfusion` command splits a
    file (`dpfusion query -f`): each one can be given to `Session.sql`.

    >>> dpfusion.split_statements("SELECT COUNT(*) FROM pums; SELECT 'a;b' AS x")
    ['SELECT COUNT(*) FROM pums', "SELECT 'a;b' AS x"]
    """
    ...

class Error(Exception):
    """Any dpfusion error. `.code` is a stable identifier of its kind (`config_error`, `io_error`,
    `ledger_error`, ...), `.hint` what to change (may be empty). Its message describes the call, the policy or
    the budget, never the private data.

    >>> try:
    ...     dpfusion.Session("no/such.toml")
    ... except dpfusion.Error as e:
    ...     print(e.code)
    io_error
    """

    code: str
    hint: str

class Refused(Error):
    """The query cannot be answered under the privacy policy; nothing was spent. `.code` names the rule
    (e.g. `raw_rows`), `.hint` says how to write a query that is answered. Whether a query is refused never
    depends on the data, and a refusal carries no private value.

    >>> try:
    ...     s.sql("SELECT age FROM pums")
    ... except dpfusion.Refused as e:
    ...     print(e.code, s.budget()["rho_spent"])
    raw_rows 0.0
    """

class BudgetExhausted(Refused):
    """The query costs more than what remains of the budget (or of a table's cap); nothing was spent.
    A subclass of Refused; `.code` is `over_budget`, `target_over_budget` or `table_cap`.

    >>> _ = s.sql("SET dp.rho = 0.6")
    >>> _ = s.sql("SELECT COUNT(*) AS n FROM pums")
    >>> try:
    ...     s.sql("SELECT COUNT(*) AS n FROM pums WHERE age > 30")
    ... except dpfusion.BudgetExhausted as e:
    ...     print(e.code, round(s.budget()["rho_spent"], 9))
    over_budget 0.6
    """

class Release:
    """The noisy answer to one query: its table (`to_arrow`, `to_pandas`, `to_polars`), how far off each column may be
    (`accuracy`) and what it cost (`charge`). Made only by the engine, after the debit. In a notebook it shows as a
    table with each noisy cell's ± half-width, and the charge.

    >>> r = s.sql("SELECT sex, COUNT(*) AS n FROM pums GROUP BY sex ORDER BY sex")
    >>> len(r), r.columns
    (2, ['sex', 'n'])
    >>> r.to_arrow().column("sex").to_pylist()     # the keys: the policy's public domain
    [0, 1]
    >>> r.accuracy["n"]["ci_half_width"]          # each count is within ±12 of the exact one, at 95%
    12.0
    """

    @property
    def accuracy(self) -> dict[str, ColumnAccuracy]:
        """Per output column: `kind` (`public`, `noisy`, `combined`, `per_row`, `rank`, `no_interval`) and, for a noisy
        column, `mechanism`, `std`, `ci_half_width` and `confidence` (the value and the bounded query's exact
        answer differ by at most the half-width with at least that probability); for a quantile (`rank`),
        `rank_half_width` (how many values its rank may be off beyond the best grid candidate's), `confidence`,
        `quantile`, `candidates` and `spacing`.

        >>> r = s.sql("SELECT sex, COUNT(*) AS n FROM pums GROUP BY sex")
        >>> a = r.accuracy["n"]
        >>> a["kind"], a["mechanism"], a["ci_half_width"], a["confidence"]
        ('noisy', 'discrete_gaussian', 12.0, 0.95)
        >>> r.accuracy["sex"]
        {'kind': 'public'}
        """
        ...
    @property
    def charge(self) -> Charge:
        """What the query cost: `id` (the ledger's charge number), `rho`, and `epsilon` at `delta` of this query. An
        answer from an earlier charge (the same query reused, or a sub-total derived with `SET dp.reuse = 'derive'`)
        spent nothing: `free` is then True, and `id` and `rho` are that charge's.

        A query over public tables only spent nothing and made no charge: `free` is True, `rho` and `epsilon`
        are 0 and `id` is None.

        >>> c = s.sql("SELECT COUNT(*) AS n FROM pums").charge
        >>> c["id"], round(c["rho"], 9), round(c["epsilon"], 3), c["delta"]
        (1, 0.05, 1.369, 1e-06)
        >>> s.sql("SELECT COUNT(*) AS n FROM educ_levels").charge
        {'delta': 1e-06, 'epsilon': 0.0, 'free': True, 'id': None, 'rho': 0.0}
        """
        ...
    @property
    def budget(self) -> ReleaseBudget:
        """The budget after this query: `rho_total`, `rho_spent`, `rho_remaining`, `epsilon`, `delta`.

        >>> b = s.sql("SELECT COUNT(*) AS n FROM pums").budget
        >>> round(b["rho_spent"], 9), round(b["rho_remaining"], 9)
        (0.05, 0.95)
        """
        ...
    @property
    def sql(self) -> str:
        """The SQL text.

        >>> s.sql("SELECT COUNT(*) AS n FROM pums").sql
        'SELECT COUNT(*) AS n FROM pums'
        """
        ...
    @property
    def note(self) -> Optional[str]:
        """A note on the release, else None: where its numbers come from when they were not drawn for it (reused,
        shared or derived from an earlier charge), or why the table holds the noisy aggregates rather than the
        query's own expression.

        >>> s.sql("SELECT COUNT(*) AS n FROM pums").note is None
        True
        """
        ...
    @property
    def columns(self) -> list[str]:
        """The output column names.

        >>> s.sql("SELECT COUNT(*) AS n, AVG(age) AS mean_age FROM pums").columns
        ['n', 'mean_age']
        """
        ...
    def to_arrow(self) -> Any:
        """The result as a `pyarrow.Table`, through the Arrow C stream interface: pyarrow reads the engine's buffers
        in place (no copy).

        >>> t = s.sql("SELECT sex, COUNT(*) AS n FROM pums GROUP BY sex ORDER BY sex").to_arrow()
        >>> t.column_names, t.num_rows
        (['sex', 'n'], 2)
        """
        ...
    def to_pandas(self) -> Any:
        """The result as a pandas DataFrame (needs pandas).

        >>> df = s.sql("SELECT sex, COUNT(*) AS n FROM pums GROUP BY sex ORDER BY sex").to_pandas()
        >>> list(df.columns), df["sex"].tolist()
        (['sex', 'n'], [0, 1])
        """
        ...
    def to_polars(self) -> Any:
        """The result as a polars DataFrame (needs polars).

        >>> df = s.sql("SELECT sex, COUNT(*) AS n FROM pums GROUP BY sex ORDER BY sex").to_polars()
        >>> df.columns, df["sex"].to_list()
        (['sex', 'n'], [0, 1])
        """
        ...
    def chart(self) -> Chart:
        """The release drawn as bar charts (a `Chart`): one panel per noisy numeric column, one bar per row labelled by
        its one public column (a GROUP BY key), each with its interval. A release without exactly one key among its
        columns raises `dpfusion.Error` (`invalid_parameter`). Post-processing: nothing is spent.

        >>> r = s.sql("SELECT race, COUNT(*) AS n, AVG(income) AS income FROM pums GROUP BY race ORDER BY race")
        >>> r.chart()
        dpfusion.Chart(panels=['n', 'income'], bars=12)
        >>> round(s.budget()["rho_spent"], 9)
        0.05
        """
        ...
    @property
    def public(self) -> bool:
        """True when the query read public tables only: its values are exact, every column's accuracy is
        `{'kind': 'public'}`, and it spent nothing (`charge["free"]` is True, `charge["id"]` None).

        >>> s.sql("SELECT COUNT(*) AS n FROM educ_levels").public, s.sql("SELECT COUNT(*) AS n FROM pums").public
        (True, False)
        """
        ...
    def __arrow_c_stream__(self, requested_schema: Optional[object] = None) -> object:
        """The Arrow PyCapsule protocol: the result as an Arrow C stream, read in place (no copy) by any Arrow
        library: `pyarrow.table(r)`, `polars.DataFrame(r)`, duckdb's `SELECT * FROM r`. `requested_schema` is
        accepted and ignored (the protocol allows it): the stream has the release's own schema.

        >>> import pyarrow as pa
        >>> r = s.sql("SELECT sex, COUNT(*) AS n FROM pums GROUP BY sex ORDER BY sex")
        >>> pa.table(r).column_names
        ['sex', 'n']
        """
        ...
    def __arrow_c_schema__(self) -> object:
        """The Arrow PyCapsule protocol: the result's schema as an Arrow C schema.

        >>> import pyarrow as pa
        >>> pa.schema(s.sql("SELECT COUNT(*) AS n FROM pums")).names
        ['n']
        """
        ...
    def __len__(self) -> int: ...
    def _repr_html_(self) -> str: ...

class Explanation:
    """`EXPLAIN DP`: what a query would do and cost. Nothing was read or spent. `str()` is the full report.

    >>> e = s.explain("SELECT sex, COUNT(*) AS n FROM pums GROUP BY sex")
    >>> "nothing was spent" in str(e), s.budget()["rho_spent"]
    (True, 0.0)
    """

    @property
    def rho(self) -> float:
        """The ρ the query would cost.

        >>> round(s.explain("SELECT COUNT(*) AS n FROM pums").rho, 9)
        0.05
        """
        ...
    @property
    def epsilon(self) -> float:
        """Its ε at `delta`.

        >>> round(s.explain("SELECT COUNT(*) AS n FROM pums").epsilon, 3)
        1.369
        """
        ...
    @property
    def delta(self) -> float:
        """The δ of `epsilon` (the session's `delta`).

        >>> s.explain("SELECT COUNT(*) AS n FROM pums").delta
        1e-06
        """
        ...
    @property
    def outputs(self) -> list[tuple[str, str]]:
        """Per output column, how far off its values will be (or why no interval can be given).

        >>> s.explain("SELECT sex, COUNT(*) AS n FROM pums GROUP BY sex").outputs
        [('sex', 'public (keys and constants: exact)'), ('n', '± 12 at 95% (discrete_gaussian, std 6.3246)')]
        """
        ...

class WorkloadRelease:
    """Many marginals released at once (`Session.workload`): every cell of every marginal, the noise of each chosen
    jointly for the least total error (ResidualPlanner), the counts consistent across marginals, one debit.

    >>> w = s.workload("pums", ["sex", "race", "married"], way=2, rho=0.05)
    >>> w.to_arrow().num_rows          # sex × race, sex × married, race × married
    28
    """

    @property
    def plan(self) -> WorkloadPlan:
        """The noise and accuracy: per marginal (`sets`: `columns`, `cells`, `std`, `ci_half_width`), per residual
        (`residuals`: `columns`, `contrasts`, `rho`, `sigma`), `rho`, `epsilon`, `confidence`, and the sum of every
        cell's variance (`total_variance`) beside the optimum for that ρ and answering each marginal alone
        (`optimal_variance`, `one_by_one_variance`).

        >>> p = s.workload("pums", ["sex", "race"], way=2, rho=0.05).plan
        >>> round(p["total_variance"] / p["optimal_variance"], 6), len(p["residuals"])
        (1.0, 4)
        """
        ...
    @property
    def charge(self) -> WorkloadCharge:
        """What it cost: `id` and `rho` of the charge that paid, and `reused_from`: that charge's id when the same
        workload was released before and this one was answered from it (nothing spent), else None.

        >>> c = s.workload("pums", ["sex", "race"], way=2, rho=0.05).charge
        >>> c["id"], round(c["rho"], 9), c["reused_from"]
        (1, 0.05, None)
        """
        ...
    def to_arrow(self) -> Any:
        """A long `pyarrow.Table`: `marginal` (its columns), one column per chosen column (the cell's key, None where
        the marginal does not group by it), `count` (least squares, consistent) and `ci_half_width`.

        >>> s.workload("pums", ["sex", "married"], way=2, rho=0.05).to_arrow().column_names
        ['marginal', 'sex', 'married', 'count', 'ci_half_width']
        """
        ...
    def to_pandas(self) -> Any:
        """The same as a pandas DataFrame.

        >>> t = s.workload("pums", ["sex", "race", "married"], way=2, rho=0.05).to_pandas()
        >>> t.groupby("marginal").size().to_dict()
        {'race, married': 12, 'sex, married': 4, 'sex, race': 12}
        """
        ...
    def to_polars(self) -> Any:
        """The same as a polars DataFrame (needs polars).

        >>> s.workload("pums", ["sex", "married"], way=2, rho=0.05).to_polars().height
        4
        """
        ...
    def __arrow_c_stream__(self, requested_schema: Optional[object] = None) -> object:
        """The Arrow PyCapsule protocol: the table of `to_arrow` as an Arrow C stream (`pyarrow.table(w)`,
        `polars.DataFrame(w)`, duckdb's `SELECT * FROM w`), read in place; `requested_schema` is ignored.

        >>> import pyarrow as pa
        >>> pa.table(s.workload("pums", ["sex", "married"], way=2, rho=0.05)).num_rows
        4
        """
        ...
    def __arrow_c_schema__(self) -> object:
        """The Arrow PyCapsule protocol: the schema of `to_arrow` as an Arrow C schema.

        >>> import pyarrow as pa
        >>> pa.schema(s.workload("pums", ["sex", "married"], way=2, rho=0.05)).names
        ['marginal', 'sex', 'married', 'count', 'ci_half_width']
        """
        ...

class MarginalRelease:
    """One-way marginals released at once (`Session.marginals`): per column, a noisy count per key of its public
    domain, all with one Gaussian σ and paid for by one debit.

    >>> m = s.marginals("pums", ["sex", "race"], rho=0.05)
    >>> m.to_arrow().column("key").to_pylist()
    ['0', '1', '1', '2', '3', '4', '5', '6']
    """

    @property
    def plan(self) -> MarginalPlan:
        """The noise and accuracy: `sigma`, `std`, `ci_half_width` (each cell), `max_error` (all cells at once),
        `confidence`, `rho`, `epsilon`.

        >>> p = s.marginals("pums", ["sex", "race"], target_std=10).plan
        >>> round(p["std"], 6), p["confidence"], p["ci_half_width"] < p["max_error"]
        (10.0, 0.95, True)
        """
        ...
    @property
    def total(self) -> float:
        """The noisy common total (every histogram sums to it when the release is consistent).

        >>> m = s.marginals("pums", ["sex", "race"], rho=0.05)
        >>> t = m.to_pandas()
        >>> bool(abs(t[t.column == "sex"]["count"].sum() - m.total) < 1e-6)
        True
        """
        ...
    @property
    def charge(self) -> MarginalCharge:
        """What it cost: `id` and `rho`.

        >>> c = s.marginals("pums", ["sex", "race"], rho=0.05).charge
        >>> c["id"], round(c["rho"], 9)
        (1, 0.05)
        """
        ...
    def to_arrow(self) -> Any:
        """A long `pyarrow.Table`: `column`, `key`, `noisy_count`, `count` (after consistency) and `frequency`.

        >>> s.marginals("pums", ["sex"], rho=0.05).to_arrow().column_names
        ['column', 'key', 'noisy_count', 'count', 'frequency']
        """
        ...
    def to_pandas(self) -> Any:
        """The same as a pandas DataFrame.

        >>> s.marginals("pums", ["sex", "race"], rho=0.05).to_pandas().groupby("column").size().to_dict()
        {'race': 6, 'sex': 2}
        """
        ...
    def to_polars(self) -> Any:
        """The same as a polars DataFrame (needs polars).

        >>> s.marginals("pums", ["sex"], rho=0.05).to_polars()["key"].to_list()
        ['0', '1']
        """
        ...
    def __arrow_c_stream__(self, requested_schema: Optional[object] = None) -> object:
        """The Arrow PyCapsule protocol: the table of `to_arrow` as an Arrow C stream (`pyarrow.table(m)`,
        `polars.DataFrame(m)`, duckdb's `SELECT * FROM m`), read in place; `requested_schema` is ignored.

        >>> import pyarrow as pa
        >>> pa.table(s.marginals("pums", ["sex"], rho=0.05)).num_rows
        2
        """
        ...
    def __arrow_c_schema__(self) -> object:
        """The Arrow PyCapsule protocol: the schema of `to_arrow` as an Arrow C schema.

        >>> import pyarrow as pa
        >>> pa.schema(s.marginals("pums", ["sex"], rho=0.05)).names
        ['column', 'key', 'noisy_count', 'count', 'frequency']
        """
        ...
    def chart(self) -> Chart:
        """The histograms drawn as bar charts (a `Chart`): one panel per column, one bar per key, each with its
        interval `± ci_half_width`. Post-processing: nothing is spent.

        >>> s.marginals("pums", ["sex", "race"], rho=0.05).chart()
        dpfusion.Chart(panels=['sex', 'race'], bars=8)
        """
        ...

class Chart:
    """Bar charts of a release (`Release.chart()`, `MarginalRelease.chart()`): one panel per noisy column, one bar per
    released cell labelled by its public key, each with its confidence interval as an error bar, and a caption with
    σ, ρ and the confidence level. Drawn from the released numbers only (post-processing: it costs nothing). A
    notebook shows it inline (`_repr_svg_`).

    >>> c = s.sql("SELECT sex, COUNT(*) AS n FROM pums GROUP BY sex ORDER BY sex").chart()
    >>> c
    dpfusion.Chart(panels=['n'], bars=2)
    >>> c.svg.startswith("<svg")
    True
    """

    @property
    def svg(self) -> str:
        """The chart as an SVG document (text). Its fonts are the viewer's `sans-serif`.

        >>> svg = s.marginals("pums", ["sex"], rho=0.05).chart().svg
        >>> import xml.etree.ElementTree as ET
        >>> ET.fromstring(svg).tag
        '{http://www.w3.org/2000/svg}svg'
        """
        ...
    def to_png(self) -> bytes:
        """The chart as a PNG image (bytes), its text set in the bundled DejaVu Sans.

        >>> png = s.sql("SELECT sex, COUNT(*) AS n FROM pums GROUP BY sex").chart().to_png()
        >>> png[1:4]
        b'PNG'
        """
        ...
    def save(self, path: Union[str, PathLike[str]]) -> None:
        """Writes the chart to `path`, as SVG or PNG by its extension (`.svg`, `.png`); an existing file is replaced.

        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "by-sex.svg")
        >>> s.sql("SELECT sex, COUNT(*) AS n FROM pums GROUP BY sex").chart().save(path)
        >>> open(path).read(4)
        '<svg'
        """
        ...
    def _repr_svg_(self) -> str: ...

class Session:
    """A differentially private SQL session over private tables, with its privacy budget.

    `Session(config)` opens the session a configuration file describes (its tables, their policies, the budget
    and the ledger); `Session.from_policy(dict)` the same configuration given as a dict. Every query is checked
    against the tables' policies, its cost debited from the budget **before** any private row is read, and its
    answer noised; a refused query spends nothing. Two datasets are neighbours when they differ by all rows of one
    privacy unit (added or removed).

    A session is safe to share between threads: the ledger debits one query at a time, so concurrent queries
    never spend more than the budget. The GIL is released while a query runs; Ctrl-C (`KeyboardInterrupt`)
    cancels it, and its charge stays (the debit came first).

    >>> import dpfusion
    >>> s = dpfusion.Session("config/pums.toml")
    >>> s
    dpfusion.Session(tables=["pums", "visits"])
    >>> r = s.sql("SELECT sex, COUNT(*) AS n FROM pums GROUP BY sex ORDER BY sex")
    >>> r.to_pandas()          # doctest: +ELLIPSIS
       sex    n
    0    0  ...
    1    1  ...

    A session holds its ledger (a SQLite file when the configuration has a `[ledger]`) until `close()`, or the
    end of a `with` block:

    >>> with dpfusion.Session("config/pums.toml") as s2:
    ...     n = s2.sql("SELECT COUNT(*) AS n FROM pums").columns
    >>> s2.closed
    True
    """

    def __init__(self, config: Union[str, PathLike[str]]) -> None: ...
    @staticmethod
    def from_policy(policy: dict[str, Any]) -> Session:
        """Opens a session from a dict with the configuration file's structure (`session`, `tables`, `ledger`, ...),
        checked exactly as a file is; relative paths resolve against the current directory. Tables held in memory
        are added with `register`.

        >>> s2 = dpfusion.Session.from_policy({
        ...     "session": {"rho": 0.5, "default_query_rho": 0.1},
        ...     "tables": {"people": {
        ...         "path": "examples/data/pums_dup.csv", "format": "csv",
        ...         "privacy_unit": "pid", "max_rows_per_unit": 2,
        ...         "columns": {"pid": {"type": "int64"}, "age": {"type": "int64", "bounds": [0, 100]}},
        ...     }},
        ... })
        >>> s2.tables()
        {'people': ['age', 'pid']}
        >>> round(s2.sql("SELECT AVG(age) AS a FROM people").charge["rho"], 9)
        0.1
        """
        ...
    def sql(
        self, sql: str, request_id: Optional[str] = None, *, params: Optional[Params] = None
    ) -> Union[Release, Explanation, Setting]:
        """Runs one statement: a query returns a `Release`: noisy, debited, with its accuracy and charge, or, over
        public tables only, exact and free (`public` is True, every column's accuracy `{'kind': 'public'}`), with
        the same `to_arrow`, `to_pandas`, `to_polars` and Arrow stream. `EXPLAIN DP <query>` returns an
        `Explanation` (nothing spent); `SET dp.<option> = <value>` the new setting, `{'option': ..., 'value': ...}`.

        `params`: values for the query's placeholders, as duckdb takes them: a list for `?` (in order) or `$1`,
        `$2`, ...; a dict for `$name`. They are bound as values (None, bool, int, float, str, bytes, date,
        datetime), never spliced into the SQL text.

        `request_id`: an idempotency key. A query whose id was released before returns the same release again
        (the same noisy numbers) and is not charged again; the same id with another query is refused.

        >>> r = s.sql("SELECT COUNT(*) AS n FROM pums", request_id="nightly-1")
        >>> again = s.sql("SELECT COUNT(*) AS n FROM pums", request_id="nightly-1")   # a retry
        >>> again.to_arrow().equals(r.to_arrow()), again.charge["id"], len(s.history())
        (True, 1, 1)
        >>> s.sql("SET dp.rho = 0.1")
        {'option': 'dp.rho', 'value': '0.1'}
        >>> s.sql("SELECT COUNT(*) AS n FROM educ_levels").to_arrow().to_pydict()   # public: exact, nothing spent
        {'n': [16]}
        >>> round(s.sql("SELECT AVG(age) AS a FROM pums WHERE age >= ?", params=[18]).charge["rho"], 9)
        0.1
        >>> level = s.sql("SELECT level FROM educ_levels WHERE educ = $educ", params={"educ": 16})
        >>> level.to_arrow().to_pydict()
        {'level': ['graduate']}
        """
        ...
    def explain(self, sql: str, *, params: Optional[Params] = None) -> Explanation:
        """What `sql` would do and cost (private plan, sensitivities, noise, accuracy of each column), without
        reading or spending anything; raises `Refused` exactly when the query would be refused.

        `params` as in `sql`.

        >>> e = s.explain("SELECT AVG(age) AS a FROM pums")
        >>> round(e.rho, 9), s.budget()["rho_spent"]
        (0.05, 0.0)
        >>> s.explain("SELECT COUNT(*) AS n FROM pums WHERE age > ?", params=[60]).outputs[0][0]
        'n'
        """
        ...
    def budget(self) -> Budget:
        """The budget: `rho_total`, `rho_spent`, `rho_remaining`, `epsilon` of everything spent at `delta`, how many
        `charges` were made, and the δ budget of key selections (`delta_total`, `delta_spent`, `delta_remaining`).

        >>> b = s.budget()
        >>> {k: b[k] for k in ("charges", "delta", "epsilon", "rho_remaining", "rho_spent", "rho_total")}
        {'charges': 0, 'delta': 1e-06, 'epsilon': 0.0, 'rho_remaining': 1.0, 'rho_spent': 0.0, 'rho_total': 1.0}
        """
        ...
    def history(self) -> list[HistoryEntry]:
        """Every charge of the budget, oldest first: `id`, `label` (the SQL), `rho`, `measurements` (how many noisy
        measurements it paid for).

        >>> _ = s.sql("SELECT COUNT(*) AS n FROM pums")
        >>> [(h["id"], h["label"], h["measurements"]) for h in s.history()]
        [(1, 'SELECT COUNT(*) AS n FROM pums', 1)]
        """
        ...
    def tables(self) -> dict[str, list[str]]:
        """The tables this session may query, private and public, with their column names (those the policy declares).

        >>> s.tables()    # doctest: +NORMALIZE_WHITESPACE
        {'educ_levels': ['educ', 'label', 'level'], 'pums': ['age', 'sex', 'educ', 'race', 'income', 'married', 'pid'],
         'visits': ['pid', 'day', 'at', 'cost']}
        """
        ...
    def register(self, name: str, data: Any, policy: dict[str, Any]) -> None:
        """Registers in-memory data as the private table `name`: a pyarrow Table, a pandas or polars DataFrame (or
        anything with `__arrow_c_stream__`). `policy` is the table's policy as in a configuration file, **with the
        type of every column** (`{"privacy_unit": "pid", "max_rows_per_unit": 2, "columns": {"pid": {"type":
        "int64"}, "age": {"type": "int64", "bounds": [0, 100]}}}`): types are never inferred from the data. Only
        the columns the policy lists are visible; a column whose data type differs from its declared type is an
        error (convert it first). `{"public": True, "columns": {...}}` registers a **public** table instead (no
        privacy unit, no noise: queried exactly and joined with private tables on its unique columns).

        >>> import pyarrow as pa
        >>> people = pa.table({"person": [1, 2, 3], "age": [34, 51, 27], "secret": [7, 7, 7]})
        >>> s.register("people", people, {
        ...     "privacy_unit": "person",
        ...     "columns": {"person": {"type": "int64"}, "age": {"type": "int64", "bounds": [0, 100]}},
        ... })
        >>> s.tables()["people"]
        ['age', 'person']
        >>> s.sql("SELECT AVG(age) AS mean_age FROM people").columns
        ['mean_age']
        """
        ...
    def workload(
        self,
        table: str,
        columns: Sequence[str],
        *,
        way: Optional[int] = None,
        sets: Optional[Sequence[Sequence[str]]] = None,
        rho: Optional[float] = None,
        target_std: Optional[float] = None,
        target: Optional[float] = None,
        confidence: Optional[float] = None,
        loss: Optional[str] = None,
        output: Optional[str] = None,
        sums: Optional[Sequence[str]] = None,
        max_keys: Optional[int] = None,
        selection_delta: Optional[float] = None,
    ) -> WorkloadRelease:
        """Releases many marginals of `columns` of `table` (each with a public domain) in one debit: every marginal of
        `way` of the columns (2, the default: every two-way table), or the marginals listed in `sets` (lists of
        columns; `[]` is the total). The noise of each cell is chosen jointly for the least total error, and the
        counts agree across marginals. Give `rho` (the cost), `target` (the half-width wanted of each cell's
        interval, in counts) or `target_std`; `confidence` is the level of the intervals; `loss` what the noise
        minimises, `"sum"` of every cell's variance (the default: the session's `dp.workload_loss`) or `"max"`, the
        largest (every cell within the same ±x); `output` the counts, `"least_squares"` (unbiased, the default: the
        session's `dp.workload_output`) or `"nonnegative"` (consistent, no negative cell, biased); `sums` bounded
        columns whose sums are released over the same marginals beside the counts (`sum(col)` and its half-width per
        cell; ρ shared equally by the counts and each sum; the counts only are made non-negative). A column without
        a public domain has its keys selected first, where the budget has a δ for it (a tenth of ρ, spending
        `selection_delta`, the session's `dp.selection_delta` unless given): at most `max_keys` of them (the session's
        `dp.workload_keys` unless given), those of the largest noisy counts that pass the threshold.

        >>> w = s.workload("pums", ["sex", "race"], sets=[["sex", "race"], ["sex"], []], rho=0.05)
        >>> t = w.to_pandas()
        >>> bool(abs(t[t.marginal == "sex"]["count"].sum() - t[t.marginal == ""]["count"].sum()) < 1e-6)
        True
        """
        ...
    def marginals(
        self,
        table: str,
        columns: Sequence[str],
        *,
        rho: Optional[float] = None,
        target_std: Optional[float] = None,
        target: Optional[float] = None,
        consistency: bool = True,
        confidence: Optional[float] = None,
        selection_delta: Optional[float] = None,
    ) -> MarginalRelease:
        """Releases the one-way marginals (histograms) of `columns` of `table` in one debit: each cell a noisy count,
        with one Gaussian σ for all. Give `rho` (the cost), `target` (the half-width wanted of each cell's interval,
        in counts: the smallest ρ that gives it) or `target_std` (the noise wanted, in counts);
        `consistency` makes every histogram non-negative with one common total (post-processing, free);
        `confidence` is the level of the intervals (the session's by default). A column without a public domain has
        its keys selected (only those whose noisy count passes a threshold are released) where the budget has a δ
        for it; `selection_delta` is the δ that selection may spend (the session's `dp.selection_delta` by default).

        >>> m = s.marginals("pums", ["sex", "race"], rho=0.05)
        >>> m.to_arrow().num_rows          # 2 sexes and 6 races, each a noisy count
        8
        >>> round(s.budget()["rho_spent"], 9)
        0.05
        """
        ...
    def close(self) -> None:
        """Closes the session: its ledger (and its SQLite file, when it has one) is released, and every later call
        raises `dpfusion.Error` (`code` `session_closed`). Waits for the queries running in other threads; closing
        a closed session does nothing. `with dpfusion.Session(...) as s:` closes it at the end of the block.

        >>> s.close()
        >>> s.closed
        True
        >>> try:
        ...     s.sql("SELECT COUNT(*) AS n FROM pums")
        ... except dpfusion.Error as e:
        ...     print(e.code)
        session_closed
        """
        ...
    @property
    def closed(self) -> bool:
        """Whether `close()` was called (or the session's `with` block ended).

        >>> s.closed
        False
        """
        ...
    def __enter__(self) -> Session: ...
    def __exit__(self, exc_type: object, exc: object, traceback: object) -> Literal[False]: ...
