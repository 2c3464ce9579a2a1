"""Every tenant of ``tenant_flows`` (a worker serving all of them)."""

from tests.lifecycle.tenant_flows import Tenant

ACME = Tenant("acme", "hello")
GLOBEX = Tenant("globex", "bonjour")
