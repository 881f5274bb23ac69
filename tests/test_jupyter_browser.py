"""The browser driver's own edges, without a browser: a save read while the server is still writing it."""

import json
import os
import threading
import time
from types import SimpleNamespace

from jupyter_browser import save


class _Page:
    """Stands in for a Playwright page: Ctrl+S makes a 'server' write the notebook in place, in two halves."""

    def __init__(self, path, pause):
        self.path, self.pause = path, pause
        self.keyboard = SimpleNamespace(press=self._press)

    def locator(self, _):
        return SimpleNamespace(first=SimpleNamespace(click=lambda **_: None))

    def _press(self, _key):
        text = json.dumps({"cells": [], "saved": True})

        def write():
            with open(self.path, "w") as f:  # truncates now: the mtime moves before the content is there
                f.flush()
                time.sleep(self.pause)
                f.write(text[:5])
                f.flush()
                time.sleep(self.pause)
                f.write(text[5:])

        threading.Thread(target=write, daemon=True).start()


def test_a_save_is_read_only_once_the_server_has_written_it_whole(tmp_path):
    path = tmp_path / "n.ipynb"
    path.write_text("{}")
    os.utime(path, (0, 0))  # an old save: the rewrite's mtime differs even on a coarse clock
    lab = SimpleNamespace(root=tmp_path)
    assert save(_Page(path, pause=0.8), lab, "n.ipynb", timeout=10) == {"cells": [], "saved": True}
