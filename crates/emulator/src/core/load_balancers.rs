//! ARM's loadBalancers and their backendAddressPools (a child's write is a write of its parent).

use super::*;

impl State {
    pub fn put_load_balancer(
        &mut self,
        scope: &Scope,
        name: &str,
        body: &wire::LoadBalancer,
    ) -> Result<wire::LoadBalancer, Rejection> {
        let invalid_reference =
            |what: String| reject(400, "InvalidResourceReference", format!("load balancer {name}: {what}"));
        let mut frontends = Vec::new();
        for frontend in &body.properties.frontend_ip_configurations {
            let private_ip = frontend.properties.private_ip_address.clone();
            let Some(id) = frontend.properties.public_ip_address.as_ref().map(|p| &p.id) else {
                if private_ip.is_none() {
                    return Err(invalid_reference(format!(
                        "frontend {} has neither a public IP nor a private address",
                        frontend.name
                    )));
                }
                frontends.push(FrontendRecord { name: frontend.name.clone(), public_ip: None, private_ip });
                continue;
            };
            let pip = child_name(id, "publicIPAddresses").filter(|pip| {
                id.eq_ignore_ascii_case(&scope.public_ip_id(pip)) && self.resources.public_ips.contains_key(*pip)
            });
            if let Some(gateway) = pip.and_then(|pip| self.nat_gateway_using(pip, None)) {
                return Err(reject(
                    400,
                    "PublicIPAddressInUse",
                    format!(
                        "load balancer {name}: frontend {} uses {id}, which NAT gateway {gateway} uses",
                        frontend.name
                    ),
                ));
            }
            match pip {
                Some(pip) => frontends.push(FrontendRecord {
                    name: frontend.name.clone(),
                    public_ip: Some(pip.to_owned()),
                    private_ip,
                }),
                None => {
                    return Err(invalid_reference(format!(
                        "frontend {} references {id}, which does not exist",
                        frontend.name
                    )));
                }
            }
        }
        let pools: Vec<String> = body.properties.backend_address_pools.iter().map(|p| p.name.clone()).collect();
        let mut used = BTreeSet::new();
        for rule in &body.properties.load_balancing_rules {
            let p = &rule.properties;
            let frontend_ok = body.properties.frontend_ip_configurations.iter().any(|f| {
                p.frontend_ip_configuration.id.eq_ignore_ascii_case(&format!(
                    "{}/frontendIPConfigurations/{}",
                    scope.load_balancer_id(name),
                    f.name
                ))
            });
            if !frontend_ok {
                return Err(invalid_reference(format!(
                    "rule {} references frontend {}, which is not on it",
                    rule.name, p.frontend_ip_configuration.id
                )));
            }
            let pool = pools.iter().find(|pool| {
                p.backend_address_pool
                    .id
                    .eq_ignore_ascii_case(&format!("{}/backendAddressPools/{pool}", scope.load_balancer_id(name)))
            });
            let Some(pool) = pool else {
                return Err(invalid_reference(format!(
                    "rule {} references pool {}, which is not on it",
                    rule.name, p.backend_address_pool.id
                )));
            };
            if !used.insert((p.protocol, p.backend_port, pool.clone())) {
                return Err(reject(
                    400,
                    "RulesUseSameBackendPortProtocolAndPool",
                    format!(
                        "load balancer {name}: rule {} uses {:?} backend port {} on pool {pool} like another rule",
                        rule.name, p.protocol, p.backend_port
                    ),
                ));
            }
        }
        let etag = self.etag();
        self.backend_pools_of(name).into_iter().filter(|k| !pools.iter().any(|p| pool_key(name, p) == *k)).for_each(
            |k| {
                self.resources.backend_pools.remove(&k);
            },
        );
        for pool in &pools {
            if !self.resources.backend_pools.contains_key(&pool_key(name, pool)) {
                let pool_etag = self.etag();
                self.resources.backend_pools.insert(
                    pool_key(name, pool),
                    BackendPoolRecord { etag: pool_etag, addresses: Vec::new(), other_properties: Default::default() },
                );
            }
        }
        self.resources.load_balancers.insert(
            name.to_owned(),
            LoadBalancerRecord {
                etag,
                sku: body.sku.name.clone(),
                frontends,
                backend_pools: pools,
                rules: body.properties.load_balancing_rules.clone(),
            },
        );
        self.read_load_balancer(scope, name)
    }

    pub fn read_load_balancer(&self, scope: &Scope, name: &str) -> Result<wire::LoadBalancer, Rejection> {
        let lb = self.resources.load_balancers.get(name).ok_or_else(|| not_found("load balancer", name))?;
        Ok(wire::LoadBalancer {
            name: Some(name.to_owned()),
            id: Some(scope.load_balancer_id(name)),
            etag: Some(lb.etag.clone()),
            location: scope.location.clone(),
            sku: wire::Sku { name: lb.sku.clone(), tier: None },
            properties: wire::LoadBalancerProperties {
                scope: Some("Public".into()),
                frontend_ip_configurations: lb
                    .frontends
                    .iter()
                    .map(|f| wire::FrontendIpConfiguration {
                        name: f.name.clone(),
                        properties: wire::FrontendIpProperties {
                            public_ip_address: f
                                .public_ip
                                .as_ref()
                                .map(|pip| wire::IdRef { id: scope.public_ip_id(pip) }),
                            private_ip_address: f.private_ip.clone(),
                        },
                    })
                    .collect(),
                backend_address_pools: lb
                    .backend_pools
                    .iter()
                    .map(|p| wire::NamedEmpty { name: p.clone(), properties: Default::default() })
                    .collect(),
                load_balancing_rules: lb.rules.clone(),
            },
        })
    }

    /// Every load balancer, as a list call pages them (by name).
    pub fn list_load_balancers(&self, scope: &Scope) -> Vec<wire::LoadBalancer> {
        self.resources.load_balancers.keys().filter_map(|name| self.read_load_balancer(scope, name).ok()).collect()
    }

    pub(super) fn backend_pools_of(&self, lb: &str) -> Vec<String> {
        let prefix = format!("{lb}/");
        self.resources.backend_pools.keys().filter(|k| k.starts_with(&prefix)).cloned().collect()
    }

    pub fn delete_load_balancer(&mut self, name: &str) -> Result<(), Rejection> {
        if self.resources.load_balancers.remove(name).is_none() {
            return Err(not_found("load balancer", name));
        }
        for key in self.backend_pools_of(name) {
            self.resources.backend_pools.remove(&key);
        }
        Ok(())
    }

    /// ARM's DELETE of a child: a pool already gone is done (204), its load balancer gone is a
    /// 404. A child's write is a write of its parent: the load balancer's ETag changes.
    pub fn delete_backend_pool(&mut self, lb: &str, pool: &str) -> Result<(), Rejection> {
        if !self.resources.load_balancers.contains_key(lb) {
            return Err(not_found("load balancer", lb));
        }
        if self.resources.backend_pools.remove(&pool_key(lb, pool)).is_some() {
            let lb_etag = self.etag();
            if let Some(record) = self.resources.load_balancers.get_mut(lb) {
                record.etag = lb_etag;
                record.backend_pools.retain(|p| p != pool);
            }
        }
        Ok(())
    }

    pub fn get_backend_pool(&self, scope: &Scope, lb: &str, pool: &str) -> Result<wire::BackendAddressPool, Rejection> {
        if !self.resources.load_balancers.contains_key(lb) {
            return Err(not_found("load balancer", lb));
        }
        let record = self
            .resources
            .backend_pools
            .get(&pool_key(lb, pool))
            .ok_or_else(|| not_found("backend pool", &pool_key(lb, pool)))?;
        Ok(wire::BackendAddressPool {
            name: Some(pool.to_owned()),
            id: Some(format!("{}/backendAddressPools/{pool}", scope.load_balancer_id(lb))),
            etag: Some(record.etag.clone()),
            properties: wire::BackendAddressPoolProperties {
                load_balancer_backend_addresses: record.addresses.clone(),
                other: record.other_properties.clone(),
            },
        })
    }

    pub fn put_backend_pool(
        &mut self,
        scope: &Scope,
        lb: &str,
        pool: &str,
        body: &wire::BackendAddressPool,
        if_match: Option<&str>,
    ) -> Result<wire::BackendAddressPool, Rejection> {
        if !self.resources.load_balancers.contains_key(lb) {
            return Err(not_found("load balancer", lb));
        }
        let key = pool_key(lb, pool);
        let current = self.resources.backend_pools.get(&key).map(|p| p.etag.clone());
        if let Some(expected) = if_match {
            let matches = match &current {
                Some(etag) => expected == "*" || expected == etag,
                None => false,
            };
            if !matches {
                return Err(reject(
                    412,
                    "PreconditionFailed",
                    format!(
                        "backend pool {key}: If-Match {expected} but the ETag is {}",
                        current.as_deref().unwrap_or("(none)")
                    ),
                ));
            }
        }
        for address in &body.properties.load_balancer_backend_addresses {
            parse_ip(&address.properties.ip_address, "InvalidRequestFormat", "backend address")?;
        }
        let etag = self.etag();
        self.resources.backend_pools.insert(
            key,
            BackendPoolRecord {
                etag,
                addresses: body.properties.load_balancer_backend_addresses.clone(),
                other_properties: body.properties.other.clone(),
            },
        );
        // A child's write is a write of its parent.
        let lb_etag = self.etag();
        if let Some(record) = self.resources.load_balancers.get_mut(lb) {
            record.etag = lb_etag;
            if !record.backend_pools.iter().any(|p| p == pool) {
                record.backend_pools.push(pool.to_owned());
            }
        }
        self.get_backend_pool(scope, lb, pool)
    }
}
