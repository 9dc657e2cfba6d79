//! Amazon EC2 (docker-machine's `amazonec2`), through its Query API at a configurable endpoint
//! (AWS's for a region, or a compatible cloud's): instances made with the template's settings,
//! tagged with the machine's name, and bootstrapped by their user data (cloud-init runs it at
//! first boot). The tag makes creation safe to retry: a machine already made under a name is
//! found and returned, never made twice.

use std::collections::BTreeMap;

use base64::Engine;

use crate::{
    BoxFuture, CreateRequest, Driver, DriverError, Machine, MachineState,
    aws::{AwsError, Client, Credentials},
    xml::Element,
};

/// The Query API version spoken.
const VERSION: &str = "2016-11-15";
/// The tag holding a machine's name (and so finding it again).
pub const NAME_TAG: &str = "drover.io/machine";

/// What every instance of a template gets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settings {
    pub ami: String,
    pub instance_type: String,
    pub subnet_id: String,
    pub security_group_ids: Vec<String>,
    pub key_name: String,
    pub root_size_gb: u32,
    pub tags: BTreeMap<String, String>,
}

/// EC2 in one region with one template's settings.
#[derive(Debug, Clone)]
pub struct Ec2 {
    client: Client,
    settings: Settings,
    /// The endpoint and image, the key of the image's root device in [`ROOT_DEVICES`].
    image_key: String,
}

/// The root device's name of each image asked for, by endpoint and image ID: an image is
/// immutable, so one `DescribeImages` per image serves every instance made from it (a pool of
/// 100 machines had made 100 of them).
static ROOT_DEVICES: std::sync::LazyLock<std::sync::Mutex<BTreeMap<String, String>>> =
    std::sync::LazyLock::new(Default::default);

impl Ec2 {
    /// `endpoint`: empty for AWS's own in `region`.
    pub fn new(
        endpoint: &str,
        region: &str,
        credentials: Credentials,
        ca_pem: Option<&str>,
        settings: Settings,
    ) -> Result<Self, AwsError> {
        let endpoint = if endpoint.is_empty() {
            format!("https://ec2.{region}.amazonaws.com")
        } else {
            endpoint.to_owned()
        };
        Ok(Ec2 {
            client: Client::new(&endpoint, region, "ec2", VERSION, credentials, ca_pem)?,
            image_key: format!("{endpoint} {}", settings.ami),
            settings,
        })
    }

    /// The instances (not terminated) tagged `key=value`, every page of them.
    pub async fn find(&self, key: &str, value: &str) -> Result<Vec<Machine>, AwsError> {
        let mut params = vec![
            ("Filter.1.Name".to_owned(), format!("tag:{key}")),
            ("Filter.1.Value.1".to_owned(), value.to_owned()),
            ("Filter.2.Name".to_owned(), "instance-state-name".to_owned()),
        ];
        for (i, state) in ["pending", "running", "stopping", "stopped"]
            .iter()
            .enumerate()
        {
            params.push((format!("Filter.2.Value.{}", i + 1), (*state).to_owned()));
        }
        self.describe(params).await
    }

    async fn describe(&self, params: Vec<(String, String)>) -> Result<Vec<Machine>, AwsError> {
        let mut found = Vec::new();
        let mut next = String::new();
        loop {
            let mut page = params.clone();
            if !next.is_empty() {
                page.push(("NextToken".to_owned(), next.clone()));
            }
            let answer = self.client.call("DescribeInstances", &page).await?;
            if let Some(reservations) = answer.find("reservationSet") {
                for reservation in reservations.all("item") {
                    if let Some(instances) = reservation.find("instancesSet") {
                        found.extend(instances.all("item").map(machine_of));
                    }
                }
            }
            next = answer.text_of("nextToken").to_owned();
            if next.is_empty() {
                return Ok(found);
            }
        }
    }

    /// The root device's name of the template's image (`/dev/xvda`, `/dev/sda1`, …): the root
    /// disk's size is set on it.
    async fn root_device(&self) -> Result<String, AwsError> {
        let known = |devices: &BTreeMap<String, String>| devices.get(&self.image_key).cloned();
        if let Some(device) = ROOT_DEVICES.lock().ok().and_then(|d| known(&d)) {
            return Ok(device);
        }
        let answer = self
            .client
            .call(
                "DescribeImages",
                &[("ImageId.1".to_owned(), self.settings.ami.clone())],
            )
            .await?;
        let image = answer
            .find("imagesSet")
            .and_then(|s| s.find("item"))
            .ok_or_else(|| AwsError::Service {
                action: "DescribeImages".into(),
                code: "InvalidAMIID.NotFound".into(),
                message: format!("image {} does not exist in this region", self.settings.ami),
                status: 400,
            })?;
        let device = match image.text_of("rootDeviceName") {
            "" => "/dev/sda1".to_owned(),
            name => name.to_owned(),
        };
        if let Ok(mut devices) = ROOT_DEVICES.lock() {
            devices.insert(self.image_key.clone(), device.clone());
        }
        Ok(device)
    }

    /// `RunInstances`; a client token EC2 says was used with other parameters is resolved by
    /// listing the name's instances (the earlier request's, made after all), never by asking
    /// again: if none is found, the caller needs a new token.
    async fn run_or_find(&self, request: &CreateRequest<'_>) -> Result<Machine, DriverError> {
        match self.run(request).await.map_err(DriverError::from) {
            Err(DriverError::KeySpent(why)) => {
                match self.find(NAME_TAG, request.name).await?.into_iter().next() {
                    Some(made) => Ok(made),
                    None => Err(DriverError::KeySpent(format!(
                        "{why}; no instance named {} is found: a new client token is needed",
                        request.name
                    ))),
                }
            }
            other => other,
        }
    }

    async fn run(&self, request: &CreateRequest<'_>) -> Result<Machine, AwsError> {
        let s = &self.settings;
        let mut params = vec![
            ("ImageId".to_owned(), s.ami.clone()),
            ("InstanceType".to_owned(), s.instance_type.clone()),
            ("MinCount".to_owned(), "1".to_owned()),
            ("MaxCount".to_owned(), "1".to_owned()),
            // EC2's own idempotency: a retried call with the same token makes nothing new.
            (
                "ClientToken".to_owned(),
                if request.client_token.is_empty() {
                    request.name
                } else {
                    request.client_token
                }
                .to_owned(),
            ),
            (
                "UserData".to_owned(),
                base64::engine::general_purpose::STANDARD.encode(request.user_data),
            ),
            (
                "BlockDeviceMapping.1.DeviceName".to_owned(),
                self.root_device().await?,
            ),
            (
                "BlockDeviceMapping.1.Ebs.VolumeSize".to_owned(),
                s.root_size_gb.to_string(),
            ),
            (
                "BlockDeviceMapping.1.Ebs.DeleteOnTermination".to_owned(),
                "true".to_owned(),
            ),
            (
                "TagSpecification.1.ResourceType".to_owned(),
                "instance".to_owned(),
            ),
        ];
        if !s.subnet_id.is_empty() {
            params.push(("SubnetId".to_owned(), s.subnet_id.clone()));
        }
        for (i, group) in s.security_group_ids.iter().enumerate() {
            params.push((format!("SecurityGroupId.{}", i + 1), group.clone()));
        }
        if !s.key_name.is_empty() {
            params.push(("KeyName".to_owned(), s.key_name.clone()));
        }
        let mut tags = s.tags.clone();
        tags.extend(request.tags.iter().map(|(k, v)| (k.clone(), v.clone())));
        tags.insert(NAME_TAG.to_owned(), request.name.to_owned());
        tags.entry("Name".to_owned())
            .or_insert_with(|| request.name.to_owned());
        for (i, (k, v)) in tags.iter().enumerate() {
            params.push((format!("TagSpecification.1.Tag.{}.Key", i + 1), k.clone()));
            params.push((format!("TagSpecification.1.Tag.{}.Value", i + 1), v.clone()));
        }
        let answer = self.client.call("RunInstances", &params).await?;
        answer
            .find("instancesSet")
            .and_then(|s| s.find("item"))
            .map(machine_of)
            .ok_or_else(|| {
                AwsError::Malformed("RunInstances".into(), "no instance in the answer".into())
            })
    }
}

/// A `DescribeInstances`/`RunInstances` item as a machine.
fn machine_of(item: &Element) -> Machine {
    let state = item
        .find("instanceState")
        .map(|s| s.text_of("name"))
        .unwrap_or_default();
    let mut addresses = Vec::new();
    for field in ["privateIpAddress", "ipAddress"] {
        let address = item.text_of(field);
        if !address.is_empty() {
            addresses.push(address.to_owned());
        }
    }
    Machine {
        id: item.text_of("instanceId").to_owned(),
        addresses,
        state: match state {
            "pending" => MachineState::Starting,
            "running" => MachineState::Running,
            "stopping" | "stopped" => MachineState::Stopped,
            _ => MachineState::Gone,
        },
    }
}

impl From<AwsError> for DriverError {
    fn from(e: AwsError) -> Self {
        match &e {
            // Settings or credentials the cloud refuses: retrying will not help.
            AwsError::Service { code, .. }
                if code.starts_with("Invalid")
                    || code.starts_with("AuthFailure")
                    || code.starts_with("AccessDenied")
                    || code == "UnrecognizedClientException"
                    || code == "UnauthorizedOperation"
                    || code == "SignatureDoesNotMatch"
                    || code == "InvalidClientTokenId" =>
            {
                DriverError::Refused(e.to_string())
            }
            AwsError::Service { code, .. } if code == "IdempotentParameterMismatch" => {
                DriverError::KeySpent(e.to_string())
            }
            AwsError::Endpoint(..) => DriverError::Refused(e.to_string()),
            _ => DriverError::Unavailable(e.to_string()),
        }
    }
}

impl Driver for Ec2 {
    fn create<'a>(
        &'a self,
        request: &'a CreateRequest<'a>,
    ) -> BoxFuture<'a, Result<Machine, DriverError>> {
        Box::pin(async move {
            if let Some(made) = self.find(NAME_TAG, request.name).await?.into_iter().next() {
                return Ok(made);
            }
            self.run_or_find(request).await
        })
    }

    fn create_unlisted<'a>(
        &'a self,
        request: &'a CreateRequest<'a>,
    ) -> BoxFuture<'a, Result<Machine, DriverError>> {
        // `RunInstances` with the same client token makes nothing new when repeated.
        Box::pin(self.run_or_find(request))
    }

    fn get<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<Machine>, DriverError>> {
        Box::pin(async move {
            match self
                .describe(vec![("InstanceId.1".to_owned(), id.to_owned())])
                .await
            {
                Ok(found) => Ok(found.into_iter().find(|m| m.state != MachineState::Gone)),
                Err(AwsError::Service { code, .. }) if code == "InvalidInstanceID.NotFound" => {
                    Ok(None)
                }
                Err(e) => Err(e.into()),
            }
        })
    }

    fn delete<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), DriverError>> {
        Box::pin(async move {
            match self
                .client
                .call(
                    "TerminateInstances",
                    &[("InstanceId.1".to_owned(), id.to_owned())],
                )
                .await
            {
                Ok(_) => Ok(()),
                Err(AwsError::Service { code, .. }) if code == "InvalidInstanceID.NotFound" => {
                    Ok(())
                }
                Err(e) => Err(e.into()),
            }
        })
    }

    fn list<'a>(
        &'a self,
        key: &'a str,
        value: &'a str,
    ) -> BoxFuture<'a, Result<Vec<Machine>, DriverError>> {
        Box::pin(async move { Ok(self.find(key, value).await?) })
    }

    fn boots_user_data(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn instances_read_from_ec2s_answer() {
        let answer = crate::xml::parse(
            "<RunInstancesResponse><instancesSet><item><instanceId>i-0abc</instanceId>\
             <instanceState><code>0</code><name>pending</name></instanceState>\
             <privateIpAddress>10.0.0.7</privateIpAddress></item></instancesSet></RunInstancesResponse>",
        )
        .unwrap();
        let machine = machine_of(answer.find("instancesSet").unwrap().find("item").unwrap());
        assert_eq!(
            machine,
            Machine {
                id: "i-0abc".into(),
                addresses: vec!["10.0.0.7".into()],
                state: MachineState::Starting
            }
        );
    }

    #[test]
    fn refusals_are_told_apart_from_outages() {
        let service = |code: &str| AwsError::Service {
            action: "RunInstances".into(),
            code: code.into(),
            message: "m".into(),
            status: 400,
        };
        assert!(matches!(
            DriverError::from(service("InvalidAMIID.NotFound")),
            DriverError::Refused(_)
        ));
        assert!(matches!(
            DriverError::from(service("AuthFailure")),
            DriverError::Refused(_)
        ));
        assert!(matches!(
            DriverError::from(service("InsufficientInstanceCapacity")),
            DriverError::Unavailable(_)
        ));
        assert!(matches!(
            DriverError::from(service("IdempotentParameterMismatch")),
            DriverError::KeySpent(_)
        ));
    }
}
