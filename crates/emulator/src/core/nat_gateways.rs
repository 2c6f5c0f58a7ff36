//! ARM's natGateways.

use super::*;

impl State {
    /// Creates or replaces the NAT gateway: SKU StandardV2, public IPs of this resource group
    /// of their list's family that no load balancer or other NAT gateway uses, associated with
    /// this ServiceGateway or with none — and not disassociated while a registered service
    /// names it.
    pub fn put_nat_gateway(
        &mut self,
        scope: &Scope,
        name: &str,
        body: &wire::NatGateway,
    ) -> Result<wire::NatGateway, Rejection> {
        let refuse = |code: &str, what: String| reject(400, code, format!("NAT gateway {name}: {what}"));
        if !body.sku.name.eq_ignore_ascii_case("StandardV2") {
            return Err(refuse(
                "InvalidRequestFormat",
                format!("SKU {:?}; only StandardV2 is supported", body.sku.name),
            ));
        }
        let p = &body.properties;
        let mut names = [Vec::new(), Vec::new()];
        for (family, (refs, version)) in
            [(&p.public_ip_addresses, IpVersion::IPv4), (&p.public_ip_addresses_v6, IpVersion::IPv6)]
                .into_iter()
                .enumerate()
        {
            for IdRef { id } in refs {
                let pip =
                    child_name(id, "publicIPAddresses").filter(|n| id.eq_ignore_ascii_case(&scope.public_ip_id(n)));
                let Some((pip, record)) = pip.and_then(|n| self.resources.public_ips.get_key_value(n)) else {
                    return Err(refuse("InvalidResourceReference", format!("public IP {id} does not exist")));
                };
                if record.version != version {
                    return Err(refuse(
                        "InvalidRequestFormat",
                        format!("public IP {pip} is {:?}, listed among the {version:?} addresses", record.version),
                    ));
                }
                if let Some(user) = self.public_ip_user(pip, Some(name)) {
                    return Err(refuse("PublicIPAddressInUse", format!("public IP {pip} is in use by {user}")));
                }
                names[family].push(pip.clone());
            }
        }
        let associated = match &p.service_gateway {
            None => false,
            Some(IdRef { id }) if id.eq_ignore_ascii_case(&scope.service_gateway_id()) => true,
            Some(IdRef { id }) => {
                return Err(refuse("InvalidResourceReference", format!("service gateway {id} is not this one")));
            }
        };
        let users = self.services_on_nat_gateway(scope, name);
        if !associated && !users.is_empty() {
            return Err(refuse(
                "NatGatewayInUseByServiceGateway",
                format!(
                    "cannot be disassociated while services {users:?} name it; clear their publicNatGatewayId first"
                ),
            ));
        }
        let etag = self.etag();
        let [public_ips, public_ips_v6] = names;
        let record = NatGatewayRecord { etag, sku: body.sku.name.clone(), public_ips, public_ips_v6, associated };
        self.resources.nat_gateways.insert(name.to_owned(), record);
        self.read_nat_gateway(scope, name)
    }

    pub fn read_nat_gateway(&self, scope: &Scope, name: &str) -> Result<wire::NatGateway, Rejection> {
        let g = self.resources.nat_gateways.get(name).ok_or_else(|| not_found("NAT gateway", name))?;
        let spec = clb_azure::NatGatewaySpec {
            name: name.to_owned(),
            public_ips: g.public_ips.clone(),
            public_ips_v6: g.public_ips_v6.clone(),
            associated: g.associated,
        };
        let mut answer = wire::nat_gateway(scope, &spec);
        answer.name = Some(name.to_owned());
        answer.id = Some(scope.nat_gateway_id(name));
        answer.etag = Some(g.etag.clone());
        answer.sku.name.clone_from(&g.sku);
        answer.properties.provisioning_state = Some("Succeeded".into());
        Ok(answer)
    }

    /// Every NAT gateway, as a list call pages them (by name).
    pub fn list_nat_gateways(&self, scope: &Scope) -> Vec<wire::NatGateway> {
        self.resources.nat_gateways.keys().filter_map(|name| self.read_nat_gateway(scope, name).ok()).collect()
    }

    /// Deletes the NAT gateway, unless a registered service still names it.
    pub fn delete_nat_gateway(&mut self, scope: &Scope, name: &str) -> Result<(), Rejection> {
        if !self.resources.nat_gateways.contains_key(name) {
            return Err(not_found("NAT gateway", name));
        }
        let users = self.services_on_nat_gateway(scope, name);
        if !users.is_empty() {
            return Err(reject(
                400,
                "InUseNatGatewayCannotBeDeleted",
                format!("NAT gateway {name} is named by services {users:?}; unregister them first"),
            ));
        }
        self.resources.nat_gateways.remove(name);
        Ok(())
    }
}
