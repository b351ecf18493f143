"""What tenants announces to the layers above it (which it may not import).

``api_key_revoked`` is sent once a revocation has committed, with
``api_key`` (the revoked key). The fleet's auth cache listens, so a revoked
key's cached authentication is gone for every web process at once instead
of serving the key again during a database outage.
"""

from django.dispatch import Signal

api_key_revoked = Signal()
