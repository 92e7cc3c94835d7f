"""wfjail's guest library: speak the framed pipe protocol from confined Python code.

``wfjail.protocol`` is the codec, ``wfjail.guest`` runs a handler. Importing this
package loads only the exception classes, so it is cheap enough for a preloaded zygote.
"""

from .errors import ProtocolError, Violation

__version__ = "0.1.0"

__all__ = ["ProtocolError", "Violation", "__version__"]
