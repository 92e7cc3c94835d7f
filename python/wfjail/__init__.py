"""wfjail's guest library: speak the framed pipe protocol from confined Python code.

``wfjail.wire`` holds every wire vocabulary and the framing, ``wfjail.protocol`` is the
guest protocol's codec, ``wfjail.guest`` runs a handler; ``wfjail.client`` drives
``wfjail.conversation`` (a session's worker side) over sockets. Importing this package loads
only the exception classes, so it is cheap enough for a preloaded zygote.
"""

from .errors import ProtocolError, Violation

__version__ = "0.1.0"

__all__ = ["ProtocolError", "Violation", "__version__"]
