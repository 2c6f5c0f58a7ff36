//! NRP's serviceGateway: the services and address-location updates (each applied whole or not at
//! all) and their paged lists.

use super::*;

impl State {
    pub fn update_services(&mut self, scope: &Scope, request: &wire::UpdateServicesRequest) -> Result<(), Rejection> {
        let mut services = self.resources.services.clone();
        let locations = &self.resources.locations;
        let default_conflict = |name: &str| {
            reject(
                400,
                "MultipleDefaultServicesNotAllowedInServiceGateway",
                format!("service {name}: the gateway's default service cannot be changed, replaced or duplicated"),
            )
        };
        if request.action == UpdateAction::FullUpdate {
            let listed: BTreeSet<&str> =
                request.service_requests.iter().filter(|r| !r.is_delete).map(|r| r.service.name.as_str()).collect();
            let dropped: Vec<String> = services
                .iter()
                .filter(|(n, s)| !s.is_default && !listed.contains(n.as_str()))
                .map(|(n, _)| n.clone())
                .collect();
            for name in dropped {
                if Self::is_referenced(locations, &name) {
                    return Err(overlay_mappings(&name));
                }
                services.remove(&name);
            }
        }
        for entry in &request.service_requests {
            let name = &entry.service.name;
            if name.is_empty() {
                return Err(reject(400, "InvalidRequestFormat", "a service request has an empty name"));
            }
            if services.get(name).is_some_and(|s| s.is_default) {
                return Err(default_conflict(name));
            }
            if entry.is_delete {
                if !services.contains_key(name) {
                    return Err(reject(404, "NotFound", format!("service {name} is not registered")));
                }
                if Self::is_referenced(locations, name) {
                    return Err(overlay_mappings(name));
                }
                services.remove(name);
                continue;
            }
            let properties = &entry.service.properties;
            if !["Inbound", "Outbound", "InboundOutbound"]
                .iter()
                .any(|t| t.eq_ignore_ascii_case(&properties.service_type))
            {
                return Err(reject(
                    400,
                    "InvalidServiceType",
                    format!(
                        "service {name}: serviceType {:?} is not Inbound, Outbound or InboundOutbound",
                        properties.service_type
                    ),
                ));
            }
            let is_default = properties.is_default.unwrap_or(false);
            if is_default && services.values().any(|s| s.is_default) {
                return Err(default_conflict(name));
            }
            if let Some(Some(id)) = &properties.public_nat_gateway_id {
                self.check_registrable_nat_gateway(scope, name, id)?;
            }
            services.insert(
                name.clone(),
                ServiceRecord {
                    service_type: properties.service_type.clone(),
                    backend_pools: properties.load_balancer_backend_pools.clone(),
                    public_nat_gateway_id: properties.public_nat_gateway_id.clone().flatten(),
                    is_default,
                },
            );
        }
        self.resources.services = services;
        Ok(())
    }

    pub fn update_address_locations(&mut self, request: &wire::UpdateAddressLocationsRequest) -> Result<(), Rejection> {
        let mut seen = BTreeSet::new();
        let mut parsed = Vec::new();
        for entry in &request.address_locations {
            let location = parse_ip(&entry.address_location, "InvalidAddressLocation", "location")?;
            if !seen.insert(location) {
                return Err(reject(
                    400,
                    "DuplicateLocationsInRequest",
                    format!("location {} appears more than once in the request", entry.address_location),
                ));
            }
            parsed.push((location, entry));
        }
        let mut locations =
            if request.action == UpdateAction::FullUpdate { BTreeMap::new() } else { self.resources.locations.clone() };
        for (location, entry) in parsed {
            let key = location.to_string();
            if entry.addresses.is_empty() {
                locations.remove(&key);
                continue;
            }
            let mut addresses = match entry.address_update_action {
                UpdateAction::FullUpdate => BTreeMap::new(),
                UpdateAction::PartialUpdate => locations.get(&key).cloned().unwrap_or_default(),
            };
            let mut seen_addresses = BTreeSet::new();
            for address in &entry.addresses {
                let ip = parse_ip(&address.address, "InvalidAddress", "address")?;
                if ip.is_ipv4() != location.is_ipv4() {
                    return Err(reject(
                        400,
                        "AddressFamilyMismatch",
                        format!("address {} is not of the family of its location {key}", address.address),
                    ));
                }
                if !seen_addresses.insert(ip) {
                    return Err(reject(
                        400,
                        "DuplicateAddressesInLocation",
                        format!("address {} appears more than once in location {key}", address.address),
                    ));
                }
                if let Some(unknown) = address.services.iter().find(|s| !self.resources.services.contains_key(*s)) {
                    return Err(reject(
                        400,
                        "ServiceNotFound",
                        format!("address {} references service {unknown}, which is not registered", address.address),
                    ));
                }
                if address.services.is_empty() {
                    addresses.remove(&ip.to_string());
                } else {
                    addresses.insert(ip.to_string(), address.services.iter().cloned().collect());
                }
            }
            if addresses.is_empty() {
                locations.remove(&key);
            } else {
                locations.insert(key, addresses);
            }
        }
        self.resources.locations = locations;
        Ok(())
    }

    pub fn services(&self) -> Vec<wire::GatewayService> {
        let services = &self.resources.services;
        services
            .iter()
            .map(|(name, s)| wire::GatewayService {
                name: name.clone(),
                properties: wire::GatewayServiceProperties {
                    service_type: s.service_type.clone(),
                    load_balancer_backend_pools: s.backend_pools.clone(),
                    public_nat_gateway_id: s.public_nat_gateway_id.clone().map(Some),
                    is_default: Some(s.is_default),
                },
            })
            .collect()
    }

    /// `upper_v6`: echo IPv6 in upper case, as NRP may, to exercise callers' canonicalisation.
    pub fn address_locations(&self, upper_v6: bool) -> Vec<wire::AddressLocationResponse> {
        let spell = |ip: &str| if upper_v6 && ip.contains(':') { ip.to_ascii_uppercase() } else { ip.to_owned() };
        self.resources
            .locations
            .iter()
            .map(|(location, addresses)| wire::AddressLocationResponse {
                address_location: spell(location),
                addresses: addresses
                    .iter()
                    .map(|(address, services)| wire::AddressEntry {
                        address: spell(address),
                        services: services.iter().cloned().collect(),
                    })
                    .collect(),
            })
            .collect()
    }
}
