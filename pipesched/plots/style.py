"""Colours, units and saving shared by every figure."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before anything imports pyplot: there is no display here
import matplotlib.colors as mcolors  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

from pipesched.schedules.outputs import atomic_path  # noqa: E402

from . import DPI, FigureError  # noqa: E402,F401 - DPI is read from here too

FORMATS = (".png", ".svg", ".pdf")

# Forward blue, backward warm, weight-gradient green: the convention of the zero-bubble
# and DualPipe papers' figures, so people recognise them; recompute purple, apart from all.
OP_COLORS = {"F": "#3b75af", "B": "#ef8636", "W": "#519e3e", "BW": "#c53a32", "R": "#8e5fb8", "OPT": "#7f7f7f"}
OP_NAMES = {"F": "F forward", "B": "B input grad", "W": "W weight grad", "BW": "BW full backward",
            "R": "R recompute forward", "OPT": "OPT optimizer step"}
ALLREDUCE_COLOR = "#17a2b8"  # the data-parallel all-reduce lane
IDLE_COLOR = "#d9d9d9"
PAIR_EDGE = "#202020"
ARROW_COLOR = "#303030"
COMM_COLOR = "#8c8c8c"  # legend swatch of the lanes, which take their payload's colour
_NO_STAMP = {".svg": {"Date": None, "Creator": None},
             ".pdf": {"CreationDate": None, "Creator": None, "Producer": None}}


def shade(color: str, chunk: int, chunks: int) -> tuple[float, float, float]:
    """`color` for a rank's chunk-th virtual stage: the first as is, later ones lighter."""
    rgb = mcolors.to_rgb(color)
    if chunks <= 1 or chunk == 0:
        return rgb
    # no paler than this: at high density pale ops read as idle grey
    mix = 0.45 * chunk / (chunks - 1)
    return tuple(c + (1 - c) * mix for c in rgb)  # type: ignore[return-value]


def text_color(rgb: tuple[float, float, float]) -> str:
    """Black or white, whichever reads better on `rgb`."""
    r, g, b = rgb
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.6 else "white"


def time_unit(span_s: float) -> tuple[float, str]:
    """(multiplier, unit) that shows a duration of `span_s` seconds in readable numbers."""
    if span_s >= 1 or span_s == 0:
        return 1.0, "s"
    if span_s >= 1e-3:
        return 1e3, "ms"
    return 1e6, "us"


def time_axis(ax: Axes, span_s: float, origin_s: float = 0.0) -> None:
    """Tick labels and title of a seconds x axis in the unit that suits `span_s` seconds;
    x = 0 is labelled `origin_s` (a drawn window's start)."""
    scale, unit = time_unit(span_s)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{(v + origin_s) * scale:.6g}"))
    ax.set_xlabel(f"time ({unit})")


def points_per_unit(ax: Axes) -> tuple[float, float]:
    """Points per data unit along x and y (the axes' limits and position must be final)."""
    box = ax.get_position()
    fig_w, fig_h = ax.figure.get_size_inches()
    x0, x1 = ax.get_xlim()
    y0, y1 = ax.get_ylim()
    return box.width * fig_w * 72 / abs(x1 - x0), box.height * fig_h * 72 / abs(y1 - y0)


def bytes_unit(peak: float) -> tuple[float, str]:
    """(divisor, unit) for a memory axis whose largest value is `peak` bytes."""
    for power, unit in ((3, "GiB"), (2, "MiB"), (1, "KiB")):
        if peak >= 1024 ** power:
            return 1024.0 ** power, unit
    return 1.0, "B"


def check_output(path: str | Path) -> Path:
    """The figure path, or FigureError when its extension is not one we write."""
    path = Path(path)
    if path.suffix.lower() not in FORMATS:
        raise FigureError(f"cannot write a figure to {str(path)!r}: the name must end in "
                         f"{', '.join(FORMATS)}")
    return path


def save(fig: Figure, path: str | Path) -> Path:
    """Write `fig` as PNG, SVG or PDF (by extension), atomically: a failed write leaves
    the previous file as it was (OutputError)."""
    path = check_output(path)
    suffix = path.suffix.lower()
    with atomic_path(path) as tmp:
        if suffix == ".png":
            _save_png(fig, tmp)
        else:
            # no dates or versions in the file, and SVG ids from a fixed salt rather than at random,
            # so regenerated figures only change when the picture does
            with matplotlib.rc_context({"svg.hashsalt": "pipesched"}):
                fig.savefig(tmp, dpi=DPI, metadata=_NO_STAMP[suffix])
    return path


def _save_png(fig: Figure, path: Path) -> None:
    """A 256-colour PNG: a figure has few distinct colours, and a palette makes the file
    several times smaller than RGBA at no visible cost."""
    from io import BytesIO

    from PIL import Image  # matplotlib's own dependency

    buf = BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, facecolor="white", metadata={"Software": None})
    image = Image.open(buf).convert("RGB").quantize(256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    image.save(path, optimize=True)
