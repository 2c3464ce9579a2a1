"""Only the tenant 'acme' of ``tenant_flows`` (a worker that does not serve 'globex')."""

from tests.lifecycle.tenant_flows import Tenant

ACME = Tenant("acme", "hello")
