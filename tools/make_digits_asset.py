"""Write calibkit/assets/digits/optdigits_test.npz from scikit-learn's copy of the digits.

calibkit ships the 1,797 8x8 digit images itself so that neither the "digits" data set nor the
default out-of-distribution set needs scikit-learn. Run this once (scikit-learn installed) to
rebuild the file; tests/test_data.py checks, when scikit-learn is present, that the shipped arrays
equal ``sklearn.datasets.load_digits()`` exactly.

    python tools/make_digits_asset.py
"""

from pathlib import Path

import numpy as np
from sklearn.datasets import load_digits

OUT = Path(__file__).resolve().parent.parent / "calibkit" / "assets" / "digits" / "optdigits_test.npz"


def main() -> None:
    d = load_digits()
    images = d.images.astype(np.uint8)  # integers 0..16, shape (1797, 8, 8)
    assert np.array_equal(images, d.images) and images.max() == 16
    np.savez_compressed(OUT, images=images, labels=d.target.astype(np.uint8))
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
