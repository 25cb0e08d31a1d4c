"""The SGLang release the tests run on (that of the tree they import), for the few lines
that differ between releases: write them `if RELEASE >= (0, 5, 23):` (an if statement,
else but no elif, or a conditional expression). tools/fork.py export keeps only the
branch of the release it exports, so a reviewer of one release reads its code only."""
from sglang._version import __version_tuple__

RELEASE = tuple(__version_tuple__[:3])
