"""Reports of a campaign: the tables (:mod:`.data`), figures (:mod:`.figures`) and HTML page
(:mod:`.html`) behind ``parsearch report`` and ``notebooks/analysis.ipynb``.

Typical use::

    from parsearch.report import load_report_data, write_report
    data = load_report_data("campaign.db")      # latest campaign, opened read-only
    write_report(data, "report/")               # report/index.html + report/*.png

Imports matplotlib and pandas, so nothing in the search path imports this package.
"""

from parsearch.report.data import (
    Accuracy,
    ReportData,
    accuracy,
    convergence,
    load_report_data,
    pareto_front,
    top_table,
    tp_pp_grid,
)
from parsearch.report.figures import (
    FIGURES,
    convergence_figure,
    heatmap_figure,
    pareto_figure,
    prediction_figure,
)
from parsearch.report.html import render_html, write_report

__all__ = [
    "FIGURES",
    "Accuracy",
    "ReportData",
    "accuracy",
    "convergence",
    "convergence_figure",
    "heatmap_figure",
    "load_report_data",
    "pareto_figure",
    "pareto_front",
    "prediction_figure",
    "render_html",
    "top_table",
    "tp_pp_grid",
    "write_report",
]
