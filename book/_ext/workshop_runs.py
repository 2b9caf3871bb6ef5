"""The workshop guide's run times (book/workshop.md), read from results/<gpu>/runs.json when the book is built.

`python -m utils.run_book --simulate t4 ...` records how each chapter's run went on a big GPU made
to act as a small one (utils/run_book.py). The guide shows those records with no number typed by
hand:

    ```{workshop-runs}
    ```

draws the table of every recorded run (chapter, preset asked, sizes it ran, minutes, outcome, GPU,
torch, date), or says plainly that the times have not been measured yet when nothing is recorded;
and, in an agenda,

    {workshop-minutes}`03_inference`

is the chapter's time in the workshop preset ("7 min", "2 min (smoke sizes)", "failed",
"not measured yet"); `{workshop-minutes}`03_inference colab`` is its time in the colab preset (the
chapters' "Time:" lines show both). The runs files are checked as the build starts, like the benchmarks page's
results files: one that is empty, not JSON or not a runs file stops the build with an error that
names it. A role naming no chapter of notebooks/ fails the build too (a warning, under -W). The work
is done by utils/workshop.py, loaded without utils/__init__.py (which imports torch).
"""
import sys
from pathlib import Path

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.errors import ExtensionError
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective, SphinxRole

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its neighbour, as Sphinx's local_extensions loads it
from benchmarks_page import load_utils_module  # noqa: E402

logger = logging.getLogger(__name__)


def load_workshop():
    """This repository's utils/workshop.py, imported without importing torch."""
    return load_utils_module("workshop")


def check_runs(app, config=None):
    """Read every runs file as the build starts; a broken one becomes an ExtensionError that names it."""
    workshop = load_workshop()
    try:
        return workshop.gather_runs(Path(app.srcdir) / "results")
    except workshop.RunsError as error:
        raise ExtensionError(f"workshop guide: {error}") from error


class WorkshopRunsDirective(SphinxDirective):
    """```{workshop-runs}```: the table of the recorded runs as a small GPU, or a sentence saying there are none."""

    def run(self):
        workshop = load_workshop()
        try:
            markdown = workshop.runs_markdown(self.env.srcdir)
        except workshop.RunsError as error:
            raise self.error(f"workshop-runs: {error}")
        container = nodes.container(classes=["workshop-runs"])
        self.state.nested_parse(StringList(markdown.splitlines(), source=self.env.docname), self.content_offset,
                                container)
        return [container]


class WorkshopMinutesRole(SphinxRole):
    """{workshop-minutes}`NN_chapter` or `NN_chapter PRESET`: the chapter's recorded time in that preset (workshop unless named)."""

    def run(self):
        workshop = load_workshop()
        chapter, *preset = self.text.split()
        preset = preset[0] if preset else workshop.AGENDA_PRESET
        if preset not in workshop.SIMULATED_PRESETS:
            logger.warning(f"workshop-minutes: preset {preset!r} is not one the runner records as a small GPU "
                           f"({', '.join(workshop.SIMULATED_PRESETS)})", location=self.get_location())
            return [nodes.inline(text=workshop.NOT_MEASURED)], []
        if not (Path(self.env.srcdir) / "notebooks" / f"{chapter}.ipynb").exists():
            logger.warning(f"workshop-minutes: no chapter notebooks/{chapter}.ipynb", location=self.get_location())
            return [nodes.inline(text=workshop.NOT_MEASURED)], []
        try:
            run = workshop.workshop_run(workshop.gather_runs(Path(self.env.srcdir) / "results"), chapter, preset)
        except workshop.RunsError as error:
            logger.warning(f"workshop-minutes: {error}", location=self.get_location())
            run = None
        return [nodes.inline(text=workshop.minutes_text(run), classes=["workshop-minutes"])], []


def setup(app):
    app.connect("config-inited", check_runs)
    app.add_directive("workshop-runs", WorkshopRunsDirective)
    app.add_role("workshop-minutes", WorkshopMinutesRole())
    return {"parallel_read_safe": True, "parallel_write_safe": True}
