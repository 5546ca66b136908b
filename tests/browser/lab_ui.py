"""What a learner does in JupyterLab, as Playwright calls: open a notebook, Run All from the Run menu,
press the toolbar's Stop and run buttons, drag a slider; and what they see, read from the page.

Selectors are JupyterLab 4's own class names and toolbar `data-command` attributes.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NOTEBOOK_DIR = REPO / "notebooks"
NOTEBOOK = ".jp-NotebookPanel:not(.lm-mod-hidden)"

# One poll of the page: every cell's kind, prompt ("[3]:", "[*]:", "[ ]:"), source text, output
# text, error outputs and the hash of each output image. FNV-1a over the data URL: distinct frames
# of the dashboard have distinct hashes, and a 100 kB string hashes in about a millisecond.
CELLS_JS = """
(selector) => {
  const hash = (text) => { let h = 2166136261; for (let i = 0; i < text.length; i++) {
      h ^= text.charCodeAt(i); h = Math.imul(h, 16777619); } return (h >>> 0).toString(16) + ':' +
      text.length; };
  const panel = document.querySelector(selector);
  if (!panel) return [];
  return [...panel.querySelectorAll('.jp-Notebook .jp-Cell')].map((cell) => ({
    kind: cell.classList.contains('jp-CodeCell') ? 'code' : (cell.classList.contains('jp-MarkdownCell') ?
    'markdown' : 'raw'),
    prompt: (cell.querySelector('.jp-InputPrompt') || {}).textContent || '',
    source: (cell.querySelector('.cm-content') || {}).textContent || '',
    rendered: (cell.querySelector('.jp-RenderedMarkdown') || {}).textContent || '',
    output: [...cell.querySelectorAll('.jp-OutputArea-output')].map((o) => o.textContent).join('\\n'),
    errors:
    [...cell.querySelectorAll('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')]
      .map((o) => o.textContent).filter((t) => /Traceback|Error/.test(t)),
    images: [...cell.querySelectorAll('.jp-OutputArea-output img')].map((img) => hash(img.src)),
  }));
}
"""


def open_notebook(page, lab, name: str, workspace: str):
    """Open notebooks/`name` in a fresh workspace; return when its cells are rendered and its kernel is
    idle."""
    page.goto(lab.notebook_url(name, workspace))
    page.wait_for_selector(f"{NOTEBOOK} .jp-Notebook .jp-Cell", timeout=60_000)
    deadline = time.monotonic() + 90
    # Until the file is loaded the panel shows one empty placeholder cell and an "idle" indicator
    # with no kernel behind it: wait for the notebook's text and for its kernel to be up and idle.
    while True:
        current = cells(page)
        loaded = current and any(c["source"] or c["rendered"] for c in current)
        kernels = [s["kernel"]["execution_state"] for s in lab.api("sessions") if s["path"].endswith(name)]
        if loaded and kernels == ["idle"] and kernel_status(page) == "idle":
            return current
        if time.monotonic() > deadline:
            raise AssertionError(f"{name} did not load with an idle kernel (kernels {kernels}, "
                                 f"indicator {kernel_status(page)!r})")
        time.sleep(0.25)


def open_from_file_browser(page, name: str, timeout: float = 60) -> list[dict]:
    """Double-click `name` in the file browser (JupyterLab already loaded); return its cells once every
    markdown cell is rendered. Does not wait for the kernel."""
    page.locator(".jp-DirListing-item", has=page.locator(".jp-DirListing-itemText", has_text=re.compile(
        f"^{re.escape(name)}$"))).dblclick()
    page.locator(".lm-TabBar-tab.lm-mod-current", has_text=name).wait_for()

    def rendered(current):
        markdown = [c for c in current if c["kind"] == "markdown"]
        return bool(markdown) and all(c["rendered"] for c in markdown)

    return wait_until(page, rendered, timeout=timeout, poll=0.2, what=f"{name} to render")


def close_current_tab(page) -> None:
    """File > Close Tab, discarding changes: the running kernel rewrites the notebook's kernel metadata
    (its Python version), so JupyterLab asks whether to save; the copy under test is not kept anyway."""
    menu(page, "File", "Close Tab")
    discard = page.locator(".jp-Dialog button", has_text="Discard")
    try:
        discard.click(timeout=2000)
    except Exception:  # no dialog: nothing had changed
        pass


def cells(page) -> list[dict]:
    return page.evaluate(CELLS_JS, NOTEBOOK)


def kernel_status(page) -> str | None:
    indicator = page.query_selector(f"{NOTEBOOK} .jp-Notebook-ExecutionIndicator")
    return indicator.get_attribute("data-status") if indicator else None


def wait_for_kernel_idle(page, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while kernel_status(page) != "idle":
        if time.monotonic() > deadline:
            raise AssertionError(f"kernel not idle after {timeout} s (status {kernel_status(page)!r})")
        time.sleep(0.2)


def is_running(prompt: str) -> bool:
    """A cell that runs or waits in the queue shows [*]."""
    return "*" in prompt


def has_run(prompt: str) -> bool:
    return re.search(r"\[\d+\]", prompt) is not None


def menu(page, top: str, item: str) -> None:
    """Click a menu bar entry, then one of its items (as a learner does)."""
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(f"^{re.escape(top)}$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(f"^{re.escape(item)}$")).first.click()


def toolbar(page, command: str) -> None:
    """Click the notebook toolbar button of a JupyterLab command (e.g. notebook:interrupt-kernel)."""
    page.locator(f'{NOTEBOOK} .jp-Toolbar [data-command="{command}"]').first.click()


def accept_dialog(page) -> None:
    page.locator(".jp-Dialog .jp-mod-accept").click()


def cell_locator(page, index: int):
    return page.locator(f"{NOTEBOOK} .jp-Notebook .jp-Cell").nth(index)


def select_cell(page, index: int) -> None:
    """Select a cell (command mode) by clicking its prompt, as a learner clicks left of the code."""
    cell_locator(page, index).locator(".jp-InputPrompt").click()


def index_of(all_cells: list[dict], text: str, kind: str = "code") -> int:
    for index, cell in enumerate(all_cells):
        if cell["kind"] == kind and text in cell["source"]:
            return index
    raise AssertionError(f"no {kind} cell contains {text!r}")


def wait_until(page, predicate, timeout: float, poll: float = 0.1, what: str = "condition"):
    """Poll `cells(page)` until predicate(cells) is true; return those cells."""
    deadline = time.monotonic() + timeout
    while True:
        current = cells(page)
        if predicate(current):
            return current
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(poll)


def all_done(all_cells: list[dict]) -> bool:
    code = [c for c in all_cells if c["kind"] == "code"]
    return bool(code) and all(has_run(c["prompt"]) for c in code)


def drag_slider(page, slider, pixels: float) -> None:
    """Drag a noUiSlider handle (ipywidgets' sliders) sideways by `pixels`, then release."""
    handle = slider.locator(".noUi-handle").first
    handle.scroll_into_view_if_needed()
    box = handle.bounding_box()
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    page.mouse.move(x, y)
    page.mouse.down()
    page.mouse.move(x + pixels / 2, y, steps=5)
    page.mouse.move(x + pixels, y, steps=5)
    page.mouse.up()


def slider(page, cell_index: int, label: str):
    """The ipywidgets slider whose label reads `label`, in the output of one cell."""
    return cell_locator(page, cell_index).locator(".widget-slider", has=page.locator(
        ".widget-label", has_text=re.compile(f"^{re.escape(label)}$")))


def label_is_cut(slider_locator) -> bool:
    """Whether the slider's label is truncated (its text wider than its box: "temperat...")."""
    return slider_locator.locator(".widget-label").evaluate("(el) => el.scrollWidth > el.clientWidth + 1")


def readout(slider_locator) -> float:
    return float(slider_locator.locator(".widget-readout").inner_text().strip())


def output_images(page, cell_index: int) -> list[str]:
    return cells(page)[cell_index]["images"]
