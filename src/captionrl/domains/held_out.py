"""Held-out corpora: real series from other domains than the embedded training corpus, shipped offline.

A claim that a captioner learned to describe series holds only on series it never saw; later windows of its
training series are not that. These corpora share no series and no domain with the embedded corpus
(``domains.corpora.EMBEDDED``: atmosphere, solar, industry, hydrology, ocean, economy) and come inside
packages captionrl already depends on, so the main job's final checks run on them with no download:

- ``fertility`` (domain ``demography``): the World Bank's total fertility rate per country, 1960-2013,
  yearly (``statsmodels/datasets/fertility``); countries with fewer than 32 reported years are left out,
  inner gaps are interpolated and reported in ``meta["gaps"]``.
- ``stocks`` (domain ``finance``): monthly closing prices of ten stocks and indices, 1990-2022
  (matplotlib's ``sample_data/Stocks.csv``); each series starts at its first reported month.
- ``eeg`` (domain ``neuro``): four standardised EEG channels of 800 samples each (matplotlib's
  ``sample_data/eeg.dat``, float64, sample-major).

``load_held_out(names)`` returns them as ``Series`` whose ``domain`` names the corpus, so a report per
domain is a report per corpus.
"""

from __future__ import annotations

import csv
import importlib.util
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from captionrl.domains.timeseries import make_series
from captionrl.errors import ConfigError, DataError
from captionrl.types import Series

MIN_LENGTH = 32
"""A held-out series shorter than this (after trimming unreported ends) is left out."""


def _package_dir(package: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise DataError("data.test_corpora", package, f"{package} is not installed",
                        f"pip install {package} (a captionrl dependency)")
    return Path(next(iter(spec.submodule_search_locations)))


def _file(package: str, *parts: str) -> Path:
    path = _package_dir(package).joinpath(*parts)
    if not path.is_file():
        raise DataError("data.test_corpora", str(path), f"is missing from the installed {package}",
                        f"reinstall {package} (pip install --force-reinstall {package})")
    return path


def _trimmed(cells: Sequence[str]) -> list[float] | None:
    """Reported values from the first to the last non-empty cell (inner gaps as NaN); None when too short."""
    idx = [i for i, c in enumerate(cells) if c.strip()]
    if not idx:
        return None
    values = [float(c) if c.strip() else float("nan") for c in cells[idx[0]: idx[-1] + 1]]
    return values if len(values) >= MIN_LENGTH else None


def load_fertility() -> list[Series]:
    """Total fertility rate per country, yearly (statsmodels' World Bank extract)."""
    path = _file("statsmodels", "datasets", "fertility", "fertility.csv")
    with path.open(newline="", encoding="utf-8-sig") as f:
        rows = list(csv.reader(f))
    header, out = rows[0], []
    first_year = header.index("1960")
    for row in rows[1:]:
        values = _trimmed(row[first_year:])
        if values is not None:
            out.append(make_series(values, id=f"fertility:{row[1]}", source=f"fertility:{row[1]}",
                                   fill="interpolate", domain="demography",
                                   meta={"freq": "yearly", "name": row[0], "corpus": "fertility"}))
    return out


def load_stocks() -> list[Series]:
    """Monthly closing prices of ten stocks and indices (matplotlib's sample data)."""
    path = _file("matplotlib", "mpl-data", "sample_data", "Stocks.csv")
    with path.open(newline="", encoding="utf-8") as f:
        rows = [r for r in csv.reader(f) if r and not r[0].startswith("#")]
    header, out = rows[0], []
    for j, name in enumerate(header[1:], start=1):
        values = _trimmed([r[j] for r in rows[1:]])
        if values is not None:
            sid = name.lstrip("^")
            out.append(make_series(values, id=f"stocks:{sid}", source=f"stocks:{sid}", fill="interpolate",
                                   domain="finance", meta={"freq": "monthly", "name": name, "corpus": "stocks"}))
    return out


def load_eeg() -> list[Series]:
    """Four standardised EEG channels (matplotlib's sample data: 800 samples x 4 channels, float64)."""
    raw = np.fromfile(_file("matplotlib", "mpl-data", "sample_data", "eeg.dat"), dtype=np.float64)
    if raw.size != 3200:
        raise DataError("data.test_corpora", "eeg", f"eeg.dat holds {raw.size} values, not 800 x 4",
                        "reinstall matplotlib")
    channels = raw.reshape(800, 4)
    return [make_series(channels[:, c], id=f"eeg:ch{c}", source=f"eeg:ch{c}", domain="neuro",
                        meta={"freq": "sample", "corpus": "eeg"}) for c in range(4)]


HELD_OUT: dict[str, Callable[[], list[Series]]] = {"fertility": load_fertility, "stocks": load_stocks,
                                                   "eeg": load_eeg}
"""Held-out corpus name -> its loader."""


def load_held_out(names: Sequence[str], field: str = "data.test_corpora") -> list[Series]:
    """The named held-out corpora's series, in the order named."""
    out: list[Series] = []
    for name in names:
        if name not in HELD_OUT:
            from captionrl.registry import suggest

            raise ConfigError(field, name, "is not a held-out corpus", suggest(name, list(HELD_OUT)))
        out.extend(HELD_OUT[name]())
    return out
