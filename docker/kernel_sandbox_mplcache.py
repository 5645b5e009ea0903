"""Seed matplotlib's cache directory with the font list made when the image was built.

The container's root filesystem is read-only and MPLCONFIGDIR points into an empty tmpfs,
so without this every kernel would rebuild the font list on its first matplotlib import.
Runs at interpreter start (from kernel_sandbox_mplcache.pth); costs a few system calls.
"""

import os

SEED_DIR = "/opt/matplotlib"


def seed() -> None:
    """Copy the prebuilt font list into $MPLCONFIGDIR when it is not there yet."""
    target = os.environ.get("MPLCONFIGDIR")
    if not target or os.path.abspath(target) == SEED_DIR:
        return
    try:
        names = [n for n in os.listdir(SEED_DIR) if n.startswith("fontlist-")]
        os.makedirs(target, exist_ok=True)
        for name in names:
            dest = os.path.join(target, name)
            if not os.path.exists(dest):
                with open(os.path.join(SEED_DIR, name), "rb") as src, open(dest, "wb") as out:
                    out.write(src.read())
    except OSError:
        pass
