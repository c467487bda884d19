"""autoscalerd: a predictive, SLO-guarded autoscaler daemon for LLM inference on Ray Serve."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("autoscalerd")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0+unknown"
