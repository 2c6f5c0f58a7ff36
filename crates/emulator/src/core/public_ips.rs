//! ARM's publicIPAddresses.

use super::*;

impl State {
    pub fn put_public_ip(
        &mut self,
        scope: &Scope,
        name: &str,
        body: &wire::PublicIpAddress,
    ) -> Result<wire::PublicIpAddress, Rejection> {
        if !body.properties.public_ip_allocation_method.eq_ignore_ascii_case("Static") {
            return Err(reject(
                400,
                "InvalidRequestFormat",
                format!(
                    "public IP {name}: allocation method {:?}; only Static is supported",
                    body.properties.public_ip_allocation_method
                ),
            ));
        }
        let version = body.properties.public_ip_address_version;
        if let Some(existing) = self.resources.public_ips.get(name) {
            if existing.version != version {
                return Err(reject(
                    400,
                    "InvalidRequestFormat",
                    format!("public IP {name}: the IP version of an existing address cannot change"),
                ));
            }
        } else {
            let ip_address = match version {
                IpVersion::IPv4 => {
                    self.next_v4 += 1;
                    Ipv4Addr::from(u32::from(Ipv4Addr::new(20, 0, 0, 0)) + self.next_v4).to_string()
                }
                IpVersion::IPv6 => {
                    self.next_v6 += 1;
                    Ipv6Addr::from(u128::from(Ipv6Addr::new(0x2603, 0x1030, 0, 0, 0, 0, 0, 0)) + self.next_v6)
                        .to_string()
                }
            };
            let tags = BTreeMap::new();
            self.resources.public_ips.insert(name.to_owned(), PublicIpRecord { version, ip_address, tags });
        }
        if let Some(record) = self.resources.public_ips.get_mut(name) {
            record.tags = body.tags.clone().unwrap_or_default();
        }
        self.get_public_ip(scope, name, body)
    }

    pub(super) fn get_public_ip(
        &self,
        scope: &Scope,
        name: &str,
        body: &wire::PublicIpAddress,
    ) -> Result<wire::PublicIpAddress, Rejection> {
        let record = self.resources.public_ips.get(name).ok_or_else(|| not_found("public IP", name))?;
        let mut answer = body.clone();
        answer.name = Some(name.to_owned());
        answer.id = Some(scope.public_ip_id(name));
        answer.properties.public_ip_address_version = record.version;
        answer.properties.ip_address = Some(record.ip_address.clone());
        answer.properties.provisioning_state = Some("Succeeded".into());
        answer.properties.ip_configuration = self.frontend_on(name).map(|(lb, frontend)| wire::IdRef {
            id: format!("{}/frontendIPConfigurations/{frontend}", scope.load_balancer_id(lb)),
        });
        answer.tags = Some(record.tags.clone()).filter(|tags| !tags.is_empty());
        Ok(answer)
    }

    /// `GET` of a public IP (what a client reads after a long-running PUT).
    pub fn read_public_ip(&self, scope: &Scope, name: &str) -> Result<wire::PublicIpAddress, Rejection> {
        let record = self.resources.public_ips.get(name).ok_or_else(|| not_found("public IP", name))?;
        let body = wire::PublicIpAddress {
            name: None,
            id: None,
            location: scope.location.clone(),
            sku: wire::Sku { name: "StandardV2".into(), tier: Some("Regional".into()) },
            properties: wire::PublicIpProperties {
                public_ip_allocation_method: "Static".into(),
                public_ip_address_version: record.version,
                ip_address: None,
                provisioning_state: None,
                ip_configuration: None,
            },
            tags: None,
        };
        self.get_public_ip(scope, name, &body)
    }

    /// Every public IP, as a list call pages them (by name).
    pub fn list_public_ips(&self, scope: &Scope) -> Vec<wire::PublicIpAddress> {
        self.resources.public_ips.keys().filter_map(|name| self.read_public_ip(scope, name).ok()).collect()
    }

    pub fn delete_public_ip(&mut self, name: &str) -> Result<(), Rejection> {
        if !self.resources.public_ips.contains_key(name) {
            return Err(not_found("public IP", name));
        }
        if let Some(user) = self.public_ip_user(name, None) {
            return Err(reject(
                400,
                "InUsePublicIpAddressCannotBeDeleted",
                format!("public IP {name} is in use by {user}"),
            ));
        }
        self.resources.public_ips.remove(name);
        Ok(())
    }
}
