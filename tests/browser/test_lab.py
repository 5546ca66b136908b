"""The lab as a learner sees it: JupyterLab in Chromium, notebooks in FAST mode (see conftest.py).

- every numbered notebook opens without a rendering error and its first cell shows the run time;
- 00_welcome: Run All finishes without error output; the GRPO dashboard changes at least three times
  while its cell runs and its final frame stays; Stop ends training cleanly and ends Run All, and
  running the cell again continues from the same step;
- the explorers (sampling's temperature, clip, RoPE, KV memory): a slider drag redraws the plot, and
  no slider label is cut.

Each check saves screenshots (see conftest.py). Run them alone with
`.venv/bin/python -m pytest tests/browser -q -s`.
"""

from __future__ import annotations

import json
import re
import time

import lab_ui as ui
import pytest

NOTEBOOKS = sorted(p.name for p in ui.NOTEBOOK_DIR.glob("[0-9][0-9]*_*.ipynb"))
DASHBOARD_CELL = "callbacks=[LiveDashboard("  # the source text that finds 00_welcome's GRPO cell
MIN_FRAME_CHANGES = 3
STOP_MESSAGE = re.compile(r"Training interrupted after step (\d+); model and history are intact")
CONTINUE_MESSAGE = re.compile(r"Continuing the run of this cell from step (\d+)")


def shot(page, screenshots_dir, name: str, locator=None) -> None:
    path = screenshots_dir / f"{name}.png"
    (locator or page).screenshot(path=str(path))


@pytest.fixture(scope="module")
def lab_page(browser_context, lab):
    """One JupyterLab tab for the open checks: loading the app once saves ~5 s per notebook."""
    page = browser_context.new_page()
    page.console_errors = []
    page.on("console", lambda message: page.console_errors.append(message.text)
            if message.type == "error" else None)
    page.goto(f"{lab.url}/lab/workspaces/open?reset&token={lab.token}")
    page.locator(".jp-DirListing-item").first.wait_for(timeout=60_000)
    yield page
    page.close()
    lab.shutdown_kernels()


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_opens_and_renders(lab_page, lab, screenshots_dir, name):
    page = lab_page
    page.console_errors.clear()
    cells = ui.open_from_file_browser(page, name)
    first = cells[0]
    assert first["kind"] == "markdown" and "Run time" in first["rendered"], (
        f"{name}: the first cell does not show the run-time line: {first['rendered'][:200]!r}")
    page.wait_for_timeout(500)  # MathJax typesets after the markdown renders
    # LaTeX that MathJax cannot typeset renders as a red merror box; a broken output as an error.
    math_errors = page.locator(f"{ui.NOTEBOOK} mjx-merror").all_inner_texts()
    assert not math_errors, f"{name}: MathJax errors {math_errors[:3]}"
    errors = [c["errors"] for c in cells if c["errors"]]
    assert not errors, f"{name}: error outputs {errors[:2]}"
    broken = page.locator(f"{ui.NOTEBOOK} .jp-OutputArea-output img").evaluate_all(
        "(imgs) => imgs.filter((img) => !(img.complete && img.naturalWidth > 0)).length")
    assert broken == 0, f"{name}: {broken} output images do not load"
    assert page.locator(".jp-Dialog").count() == 0, f"{name}: a dialog opened: {page.locator('.jp-Dialog').inner_text()}"
    assert not page.console_errors, f"{name}: browser console errors {page.console_errors[:3]}"
    shot(page, screenshots_dir, f"open_{name[:-6]}")
    ui.close_current_tab(page)
    lab.shutdown_kernels()


def watch_training_cell(page, index: int, timeout: float = 240, on_frame=None):
    """Poll while Run All runs; return (frames shown while cell `index` ran, cells at the end).

    A cell runs (rather than waits in the queue) once every code cell above it has its number.
    `on_frame(count)` is called at each new frame.
    """
    frames: list[str] = []
    started = False
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        cells = ui.cells(page)
        cell = cells[index]
        above_done = all(ui.has_run(c["prompt"]) for c in cells[:index] if c["kind"] == "code")
        running = above_done and ui.is_running(cell["prompt"])
        started = started or running
        if running and cell["images"] and (not frames or frames[-1] != cell["images"][-1]):
            frames.append(cell["images"][-1])
            if on_frame:
                on_frame(len(frames))
        if started and not running:
            # The last frame can land between two polls, just before the cell ends.
            if cell["images"] and (not frames or frames[-1] != cell["images"][-1]):
                frames.append(cell["images"][-1])
            return frames, cells
        time.sleep(0.1)
    raise AssertionError(f"cell {index} did not finish within {timeout} s; frames seen: {len(frames)}")


def test_welcome_run_all_live_dashboard(page, lab, screenshots_dir):
    cells = ui.open_notebook(page, lab, "00_welcome.ipynb", workspace="run-all")
    index = ui.index_of(cells, DASHBOARD_CELL)
    committed = set(cells[index]["images"])  # the full-mode frame saved in the notebook
    dashboard = ui.cell_locator(page, index).locator(".jp-OutputArea-output img").last

    def mid_run_screenshot(count):
        if count == 3:
            shot(page, screenshots_dir, "welcome_dashboard_mid_run", dashboard)

    ui.menu(page, "Run", "Run All Cells")
    frames, _ = watch_training_cell(page, index, on_frame=mid_run_screenshot)
    frames = [f for f in frames if f not in committed]
    print(f"dashboard frames while the GRPO cell ran: {len(frames)} ({len(frames) - 1} changes)")
    assert len(frames) - 1 >= MIN_FRAME_CHANGES, (
        f"the dashboard changed {len(frames) - 1} times while training (want >= {MIN_FRAME_CHANGES}): "
        "it is not live")
    cells = ui.wait_until(page, ui.all_done, timeout=120, what="Run All to finish")
    ui.wait_for_kernel_idle(page)
    errors = {i: c["errors"] for i, c in enumerate(cells) if c["errors"]}
    assert not errors, f"error outputs after Run All: {errors}"
    time.sleep(2)  # the final frame stays after the cell ends
    final = ui.output_images(page, index)
    assert final and final[-1] == frames[-1], "the dashboard's last frame did not stay after the cell ended"
    shot(page, screenshots_dir, "welcome_dashboard_end", dashboard)
    shot(page, screenshots_dir, "welcome_run_all_end")
    assert not page.console_errors, page.console_errors[:3]


def test_welcome_stop_ends_run_all_and_rerun_continues(page, lab, screenshots_dir):
    cells = ui.open_notebook(page, lab, "00_welcome.ipynb", workspace="stop")
    index = ui.index_of(cells, DASHBOARD_CELL)
    committed = set(cells[index]["images"])
    below = [i for i, c in enumerate(cells) if c["kind"] == "code" and i > index]

    pressed = []

    def stop_mid_run(count):
        # The second new frame: training is under way (a redraw comes after >= 5 steps).
        if not pressed and count >= 2 and ui.output_images(page, index)[-1] not in committed:
            ui.toolbar(page, "notebook:interrupt-kernel")
            pressed.append(time.monotonic())

    ui.toolbar(page, "notebook:restart-run-all")
    ui.accept_dialog(page)
    watch_training_cell(page, index, on_frame=stop_mid_run)
    assert pressed, "training ended before Stop could be pressed"
    ui.wait_for_kernel_idle(page)
    cells = ui.cells(page)
    output = cells[index]["output"]
    ui.cell_locator(page, index).locator(".jp-OutputArea-child").last.scroll_into_view_if_needed()
    shot(page, screenshots_dir, "welcome_after_stop")  # the messages under the last frame
    stopped = STOP_MESSAGE.search(output)
    assert stopped, f"no 'interrupted ... intact' message after Stop; the cell shows: {output[-600:]!r}"
    step = int(stopped.group(1))
    assert "TrainingStopped" in output and "cells below have not run" in output, output[-600:]
    not_run = [i for i in below if ui.has_run(cells[i]["prompt"])]
    assert not not_run, f"Run All carried on after Stop: cells {not_run} ran"

    ui.select_cell(page, index)
    ui.toolbar(page, "notebook:run-cell-and-select-next")
    cells = ui.wait_until(page, lambda cs: CONTINUE_MESSAGE.search(cs[index]["output"]), timeout=120,
                          what="the re-run GRPO cell to continue the run")
    ui.toolbar(page, "notebook:interrupt-kernel")  # seen it continue; Stop again rather than wait
    ui.wait_until(page, lambda cs: not ui.is_running(cs[index]["prompt"]), timeout=120,
                  what="the re-run cell to stop")
    ui.wait_for_kernel_idle(page)
    cells = ui.cells(page)
    continued = int(CONTINUE_MESSAGE.search(cells[index]["output"]).group(1))
    stopped_again = STOP_MESSAGE.search(cells[index]["output"])
    ui.cell_locator(page, index).locator(".jp-OutputArea-child").first.scroll_into_view_if_needed()
    shot(page, screenshots_dir, "welcome_rerun_continues")
    assert continued == step, f"stopped at step {step}, the re-run continued from step {continued}"
    assert stopped_again and int(stopped_again.group(1)) >= step, cells[index]["output"][-600:]
    print(f"stopped at step {step}; the re-run continued from step {continued} "
          f"and was stopped at step {stopped_again.group(1)}")


def first_image_change(page, cell_index: int, before: list[str], timeout: float = 60) -> list[str]:
    def changed(cs):
        images = cs[cell_index]["images"]
        return bool(images) and images != before

    return ui.wait_until(page, changed, timeout=timeout, what="the plot to redraw")[cell_index]["images"]


def check_slider_redraws(page, screenshots_dir, cell_index: int, label: str, pixels: float, name: str):
    """Drag one slider; the plot must redraw. Returns (value before, value after)."""
    control = ui.slider(page, cell_index, label)
    control.scroll_into_view_if_needed()
    assert not ui.label_is_cut(control), f"{name}: the label {label!r} is cut"
    before_images = ui.output_images(page, cell_index)
    assert before_images, f"{name}: no plot under the explorer"
    value_before = ui.readout(control)
    cell = ui.cell_locator(page, cell_index)
    shot(page, screenshots_dir, f"explorer_{name}_before", cell)
    ui.drag_slider(page, control, pixels)
    after_images = first_image_change(page, cell_index, before_images)
    ui.wait_for_kernel_idle(page)
    value_after = ui.readout(control)
    shot(page, screenshots_dir, f"explorer_{name}_after", cell)
    assert value_after != value_before, f"{name}: dragging {label} did not change its value"
    assert after_images != before_images
    return value_before, value_after


def test_sampling_explorer_temperature_slider(page, lab, screenshots_dir):
    cells = ui.open_notebook(page, lab, "01_sampling.ipynb", workspace="sampling")
    index = ui.index_of(cells, "sampling_explorer(weak_model")
    ui.menu(page, "Run", "Run All Cells")
    cells = ui.wait_until(page, lambda cs: ui.has_run(cs[index]["prompt"])
                          and page.locator(".widget-slider").count() > 0, timeout=180,
                          what="the sampling explorer")
    for label in ("temperature", "top_k", "top_p", "min_p", "repetition_penalty"):
        assert not ui.label_is_cut(ui.slider(page, index, label)), f"the slider label {label!r} is cut"
    # Controllable: a 20-pixel drag moves the temperature by less than a factor of 1.5.
    low, high = check_slider_redraws(page, screenshots_dir, index, "temperature", 20, "sampling_temperature")
    assert 1 < high / low < 1.5, f"a 20 px drag moved the temperature from {low} to {high}"
    ui.wait_until(page, ui.all_done, timeout=180, what="Run All to finish")
    assert not page.console_errors, page.console_errors[:3]


EXPLORER_CELLS = {  # explorer -> (code, the slider to drag)
    "clip": ('from rlhf_lab.viz import explore\nexplore("clip")', "epsilon"),
    "rope": ('explore("rope")', "position"),
    "kv_memory": ('explore("kv_memory")', "seq_len"),
}


def test_clip_rope_and_kv_memory_explorers_redraw(page, lab, screenshots_dir):
    cells = [{"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [], "source": code}
             for code, _ in EXPLORER_CELLS.values()]
    notebook = {"cells": cells, "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                            "language": "python"}},
                "nbformat": 4, "nbformat_minor": 5}
    (lab.root / "explorers.ipynb").write_text(json.dumps(notebook))
    ui.open_notebook(page, lab, "explorers.ipynb", workspace="explorers")
    ui.menu(page, "Run", "Run All Cells")
    ui.wait_until(page, ui.all_done, timeout=120, what="the explorers")
    ui.wait_until(page, lambda cs: all(c["images"] for c in cs), timeout=60, what="every explorer's plot")
    for index, (name, (_, label)) in enumerate(EXPLORER_CELLS.items()):
        for control in ui.cell_locator(page, index).locator(".widget-slider, .widget-dropdown").all():
            assert not ui.label_is_cut(control), f"{name}: a label is cut: {control.inner_text()!r}"
        check_slider_redraws(page, screenshots_dir, index, label, 60, name)
    assert not page.console_errors, page.console_errors[:3]
