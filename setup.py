"""Build hook: copy the shipped dashboards and collector configurations into the wheel.

They live at the top of the repository (``dashboards/``, ``collector/``) where the compose file,
the docs and the tests use them; ``kaos_otel.assets.ASSET_PATTERNS`` says which files ship, and
this copies them to ``kaos_otel/_data/`` in the build so ``kaos_otel.assets`` finds them in an
installed wheel.
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


def _patterns() -> dict[str, tuple[str, ...]]:
    """ASSET_PATTERNS read from kaos_otel/assets.py without importing the package."""
    tree = ast.parse((HERE / "kaos_otel" / "assets.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == "ASSET_PATTERNS":
            assert node.value is not None
            value: dict[str, tuple[str, ...]] = ast.literal_eval(node.value)
            return value
    raise RuntimeError("ASSET_PATTERNS not found in kaos_otel/assets.py")


class BuildPyWithAssets(build_py):
    """``build_py`` that also copies the assets into ``kaos_otel/_data``."""

    def run(self) -> None:
        super().run()
        target = Path(self.build_lib) / "kaos_otel" / "_data"
        for folder, patterns in _patterns().items():
            for pattern in patterns:
                for source in sorted((HERE / folder).glob(pattern)):
                    destination = target / folder / source.relative_to(HERE / folder)
                    destination.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(source, destination)


setup(cmdclass={"build_py": BuildPyWithAssets})
