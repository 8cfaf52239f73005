"""texpr's version (``texpr.__version__``), in a module of its own so that modules
below the package face (:mod:`texpr.symcache` keys its entries with it) can
import it without importing the face."""

__version__ = "0.1.0"
