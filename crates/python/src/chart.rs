//! `dpfusion.Chart`: a release drawn as bar charts, each bar with its confidence interval (the `dpfusion` command's
//! charts, `dpfusion-charts`). Drawn from the released numbers only: post-processing, it costs nothing.

use crate::errors::{to_py, usage};
use dpfusion_charts::{Chart as Drawing, ChartFormat};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};
use std::path::PathBuf;

/// Bar charts of a release (`Release.chart()`, `MarginalRelease.chart()`): one panel per noisy column, one bar per
/// released cell labelled by its public key, each with its confidence interval as an error bar, and a caption with
/// σ, ρ and the confidence level. Drawn from the released numbers only (post-processing: it costs nothing). A
/// notebook shows it inline (`_repr_svg_`).
///
/// >>> c = s.sql("SELECT sex, COUNT(*) AS n FROM pums GROUP BY sex ORDER BY sex").chart()
/// >>> c
/// dpfusion.Chart(panels=['n'], bars=2)
/// >>> c.svg.startswith("<svg")
/// True
#[pyclass(frozen, module = "dpfusion")]
pub(crate) struct Chart {
    drawing: Drawing,
    svg: String,
}

impl Chart {
    /// Draws `drawing` as SVG (the GIL released meanwhile).
    pub(crate) fn new(py: Python<'_>, drawing: Drawing) -> PyResult<Self> {
        let bytes = py.detach(|| drawing.render(ChartFormat::Svg)).map_err(to_py)?;
        let svg = String::from_utf8(bytes).map_err(|e| usage("internal_error", format!("the SVG chart: {e}")))?;
        Ok(Chart { drawing, svg })
    }

    fn render(&self, py: Python<'_>, format: ChartFormat) -> PyResult<Vec<u8>> {
        match format {
            ChartFormat::Svg => Ok(self.svg.clone().into_bytes()),
            ChartFormat::Png => py.detach(|| self.drawing.render(ChartFormat::Png)).map_err(to_py),
        }
    }
}

#[pymethods]
impl Chart {
    /// The chart as an SVG document (text). Its fonts are the viewer's `sans-serif`.
    ///
    /// >>> svg = s.marginals("pums", ["sex"], rho=0.05).chart().svg
    /// >>> import xml.etree.ElementTree as ET
    /// >>> ET.fromstring(svg).tag
    /// '{http://www.w3.org/2000/svg}svg'
    #[getter]
    fn svg(&self) -> &str {
        &self.svg
    }

    /// The chart as a PNG image (bytes), its text set in the bundled DejaVu Sans.
    ///
    /// >>> png = s.sql("SELECT sex, COUNT(*) AS n FROM pums GROUP BY sex").chart().to_png()
    /// >>> png[1:4]
    /// b'PNG'
    fn to_png<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let bytes = self.render(py, ChartFormat::Png)?;
        Ok(PyBytes::new(py, &bytes))
    }

    /// Writes the chart to `path`, as SVG or PNG by its extension (`.svg`, `.png`); an existing file is replaced.
    ///
    /// >>> import os, tempfile
    /// >>> path = os.path.join(tempfile.mkdtemp(), "by-sex.svg")
    /// >>> s.sql("SELECT sex, COUNT(*) AS n FROM pums GROUP BY sex").chart().save(path)
    /// >>> open(path).read(4)
    /// '<svg'
    fn save(&self, py: Python<'_>, path: PathBuf) -> PyResult<()> {
        let bytes = self.render(py, ChartFormat::of_path(&path).map_err(to_py)?)?;
        std::fs::write(&path, bytes).map_err(|e| usage("io_error", format!("writing {}: {e}", path.display())))
    }

    /// The SVG, for notebooks (Jupyter shows the chart inline).
    fn _repr_svg_(&self) -> &str {
        &self.svg
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let titles: Vec<&str> = self.drawing.panels.iter().map(|p| p.title.as_str()).collect();
        let panels = PyList::new(py, titles)?.repr()?;
        let bars: usize = self.drawing.panels.iter().map(|p| p.bars.len()).sum();
        Ok(format!("dpfusion.Chart(panels={panels}, bars={bars})"))
    }
}
