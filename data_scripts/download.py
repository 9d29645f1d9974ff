"""Fetch and verify the book's data sets: python data_scripts/download.py [--mirror DIR] [--cache DIR] [DATASET ...]"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from msgcore.download import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
