"""The report of a backtest of four models, one far off, as the user opens it (issue 46, "the report for many
models").

``distributed-onnx backtest`` runs the bundled reference checkpoint and three small real ONNX graphs
(``tests/graphs.py``: a copy of the week before, the context's mean scaled by 100, the day before plus 5%) on the
bundled data, four windows, on the shared local Ray. Headless Chromium opens report.html at 1280 px and measures:
no horizontal scroll, of the page or of any table; every checkpoint's sha256 in the provenance and a details
section for each checkpoint after the first; and the y axes of the skill by lead, the score by origin and the
forecast fans drawn for the other models, with the far-off one named "off the scale" on the figure and beside it,
and the fans' y label not clipped.

Before: the skill axis went to -3,500, the fans' to 3,000,000 (every other curve a flat line), the pairwise table
scrolled sideways, and the provenance named the first checkpoint only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from browser import measured_dom, needs_chromium
from conftest import start_test_ray
from graphs import write_report_models

from distributed_onnx import cli
from distributed_onnx.evaluation.report import plots as report_plots

pytestmark = pytest.mark.integration

FLAGS = ["--horizon", "48", "--n-windows", "4", "--stride", "48", "--quantiles", "0.1,0.5,0.9"]
FLAGS += ["--actors", "2", "--rows-per-batch", "4", "--no-progress"]
FAR_OFF = "far_off"

# Run at load in the page (tests/browser.py): what the user sees, written into <body data-*>.
MEASURE = r"""
var b = document.body, root = document.documentElement;
b.setAttribute('data-scroll', root.scrollWidth + ' ' + root.clientWidth);
var wide = [], tables = document.querySelectorAll('table');
for (var i = 0; i < tables.length; i++) {
  if (tables[i].scrollWidth > tables[i].clientWidth + 1 && tables[i].getBoundingClientRect().width > 0)
    wide.push(tables[i].rows[0].textContent.slice(0, 40) + ':' + tables[i].scrollWidth);
}
b.setAttribute('data-wide-tables', wide.join(' | '));
function ticks(svg) {  /* the y tick labels as numbers: 32.5k, -0.5 (matplotlib writes a Unicode minus) */
  var found = [], texts = svg.querySelectorAll('g[id^="ytick"] text');
  for (var k = 0; k < texts.length; k++) {
    var t = texts[k].textContent.replace('\u2212', '-'), scale = 1;
    if (/k$/.test(t)) scale = 1e3; else if (/M$/.test(t)) scale = 1e6; else if (/G$/.test(t)) scale = 1e9;
    found.push(parseFloat(t) * scale);
  }
  return found;
}
function after(heading) {  /* the figure after an h3 and the text up to the next heading */
  var heads = document.querySelectorAll('h3');
  for (var j = 0; j < heads.length; j++) {
    if (heads[j].textContent.indexOf(heading) !== 0) continue;
    var svg = null, text = '';
    for (var n = heads[j].nextElementSibling; n && !/^H[1-3]$/.test(n.tagName); n = n.nextElementSibling) {
      if (!svg) svg = n.tagName.toLowerCase() === 'svg' ? n : n.querySelector('svg');
      text += ' ' + n.textContent;
    }
    return svg ? Math.min.apply(null, ticks(svg)) + ' ' + Math.max.apply(null, ticks(svg)) + ' ' + text : 'missing';
  }
  return 'missing';
}
b.setAttribute('data-skill', after('Skill by lead, every model'));
b.setAttribute('data-origin', after('Score by forecast origin, every model'));
var fans = document.querySelectorAll('figure.fan'), seen = [];
for (var f = 0; f < fans.length; f++) {
  var svg = fans[f].querySelector('svg'), values = ticks(svg), texts = svg.querySelectorAll('text'), cut = 0;
  for (var t = 0; t < texts.length; t++) {  /* how far any text (the y label, a tick label) lies left of the figure */
    cut = Math.max(cut, svg.getBoundingClientRect().left - texts[t].getBoundingClientRect().left);
  }
  seen.push(Math.max.apply(null, values) + ' ' + Math.round(cut) + ' ' + fans[f].textContent);
}
b.setAttribute('data-fans', seen.join(' | '));
var heads2 = document.querySelectorAll('h2'), provenance = '';
for (var h = 0; h < heads2.length; h++) {
  if (heads2[h].textContent !== 'Provenance') continue;
  for (var m = heads2[h].nextElementSibling; m && m.tagName !== 'H2'; m = m.nextElementSibling)
    provenance += ' ' + m.innerText;
}
b.setAttribute('data-provenance', provenance.replace(/\s+/g, ' '));
var details = document.querySelectorAll('details.checkpoint > summary'), names = [];
for (var d = 0; d < details.length; d++) names.push(details[d].textContent.split(':')[0]);
b.setAttribute('data-details', names.join(' '));
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str]]]:
    """The backtest's output folder and what Chromium measured of its report at 1280 px."""
    pytest.importorskip("onnxruntime")
    needs_chromium()
    start_test_ray()  # the shared local Ray (tests/conftest.py), at module scope
    root = tmp_path_factory.mktemp("report_many")
    checkpoints = write_report_models(root, 4)
    assert [path.stem for path in checkpoints][2] == FAR_OFF
    argv = ["backtest", "--output", str(root / "run"), *FLAGS]
    for checkpoint in checkpoints:
        argv += ["--checkpoint", str(checkpoint)]
    assert cli.main(argv) == 0
    yield root / "run", measured_dom(root / "run" / "report.html", MEASURE, 1280, 3000)


def test_four_models_fit_1280_px_without_scrolling_sideways(run: tuple[Path, dict[str, str]]) -> None:
    _, seen = run
    scroll_width, client_width = map(int, seen["scroll"].split())
    assert scroll_width <= client_width <= 1280, seen["scroll"]
    assert seen["wide-tables"] == "", seen["wide-tables"]  # no table scrolls inside the page either


def test_every_checkpoint_has_its_provenance_and_its_details(run: tuple[Path, dict[str, str]]) -> None:
    output, seen = run
    models = json.loads((output / "summary.json").read_text())["models"]
    assert len(models) == 4
    for name, record in models.items():
        assert name in seen["provenance"] and record["sha256"] in seen["provenance"], name
    assert seen["details"].split() == list(models)[1:]  # the first checkpoint's are the page's own sections
    # Each checkpoint's calibration drawn, also where its coverage is 0 (the copies' intervals have no width):
    # a coverage of 0 was taken for no coverage at all.
    page = (output / "report.html").read_text()
    assert page.count("<h3>Calibration of the central intervals</h3>") == 3 and "(no central intervals" not in page


def test_a_far_off_model_is_named_off_the_scale_and_the_axes_show_the_others(
    run: tuple[Path, dict[str, str]],
) -> None:
    _, seen = run
    low, _, text = seen["skill"].split(" ", 2)
    assert float(low) > -2, seen["skill"][:300]  # the far-off model's skill is below -1,000
    assert f"off the scale: {FAR_OFF} (" in text and f"Off the scale: {FAR_OFF} (" in text  # on the figure, beside it
    _, high, text = seen["origin"].split(" ", 2)
    assert float(high) < 20, seen["origin"][:300]  # its MASE by origin is above 1,000
    assert f"off the scale: {FAR_OFF} (" in text and f"Off the scale: {FAR_OFF} (" in text
    fans = seen["fans"].split(" | ")
    assert fans
    for fan in fans:
        top, cut, text = fan.split(" ", 2)
        assert int(cut) <= 0, fan[:300]  # the y label and tick labels whole, not clipped at the figure's left
        assert float(top) < 100_000, fan[:300]  # the data are 20k-40k MW; the far-off median near 3M
        assert f"off the scale: {FAR_OFF}" in text and f"{FAR_OFF} median (off the scale)" in text
    assert re.search(r"\bfar_off\b", seen["provenance"])


def test_the_fans_y_label_and_ticks_are_whole_for_data_of_six_digits(tmp_path: Path) -> None:
    """Data from -300,000 to 300,000 (no model off the scale): before, the tick labels ("-300000") pushed the y
    label 12 px past the figure's left edge, where the page cut it."""
    needs_chromium()
    history, actual = np.linspace(-300_000, 300_000, 48), np.linspace(-310_000, 290_000, 48)
    band = (0.1, 0.9, actual - 5e3, actual + 5e3, False)
    fan = report_plots.Fan("", 0, 1_800_000_000, history, actual, [band], actual)
    page = tmp_path / "fan.html"
    page.write_text(f"<!doctype html><html><body><figure>{report_plots.FanCanvas().draw(fan)}</figure></body></html>")
    script = (
        "var svg = document.querySelector('svg'), texts = svg.querySelectorAll('text'), cut = 0;"
        "for (var t = 0; t < texts.length; t++)"
        "  cut = Math.max(cut, svg.getBoundingClientRect().left - texts[t].getBoundingClientRect().left);"
        "document.body.setAttribute('data-cut', String(Math.round(cut)));"
    )
    assert measured_dom(page, script, 1280)["cut"] == "0"


def test_the_scale_leaves_off_only_a_model_far_from_the_others() -> None:
    """Pure logic of :func:`robust_scale`: two close models keep every point; one 100 times off is left off
    and named; a model alone is never left off; a bad but not far-off model stays on the scale."""
    close = report_plots.robust_scale([np.zeros(1)], {"a": [np.array([0.2, 0.5])], "b": [np.array([0.3, 0.9])]})
    assert close.off == () and close.low < 0 and close.high > 0.9
    far = report_plots.robust_scale(
        [np.array([0.0, 1.0])], {"a": [np.array([0.8])], "b": [np.array([-3.0])], "far": [np.array([-3000.0])]}
    )
    assert far.off == ("far",) and -4 < far.low < -3 and far.note().startswith("off the scale: far (")
    alone = report_plots.robust_scale([np.zeros(1)], {"far": [np.array([5000.0])]})
    assert alone.off == () and alone.high > 5000
