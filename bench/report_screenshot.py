"""Screenshot of a `bertheads report` page in headless Chromium (for the README).

    .venv/bin/python bench/report_screenshot.py PAGE_DIR/index.html docs/report-screenshot.png
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path


def main() -> None:
    from playwright.sync_api import sync_playwright

    page_path, out = Path(sys.argv[1]), Path(sys.argv[2])
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--headless", "--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1150, "height": 1500})
            page.goto(page_path.resolve().as_uri())
            page.wait_for_load_state("load")
            widths = page.eval_on_selector_all("img", "imgs => imgs.map(i => i.naturalWidth)")
            assert widths and all(w > 0 for w in widths), widths
            page.screenshot(path=str(out), full_page=False)
        finally:
            browser.close()
    print(f"wrote {out} ({len(widths)} figures on the page)")


if __name__ == "__main__":
    main()
