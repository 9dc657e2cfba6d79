//! Amazon EKS through its REST API (JSON, Signature Version 4 with [`aws::Client::rest`]), at
//! AWS's endpoint for the region or any other that speaks it.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::{
    BoxFuture, DriverError,
    aws::{self, AwsError, Credentials},
    hosted::{Cluster, ClusterRequest, HostedProvider, NodeGroup, NodeGroupRequest, Phase, Size},
};

/// EKS in one region of one account.
#[derive(Debug, Clone)]
pub struct Eks {
    client: aws::Client,
    /// For the clusters' bearer tokens.
    credentials: Credentials,
    region: String,
}

impl Eks {
    /// `endpoint`: empty for AWS's (`https://eks.REGION.amazonaws.com`); `ca_pem`: trust it
    /// instead of the system's roots.
    pub fn new(
        endpoint: &str,
        region: &str,
        credentials: Credentials,
        ca_pem: Option<&str>,
    ) -> Result<Self, AwsError> {
        let endpoint = if endpoint.is_empty() {
            format!("https://eks.{region}.amazonaws.com")
        } else {
            endpoint.to_owned()
        };
        // EKS's REST API has no version parameter: the path is the version.
        let client = aws::Client::new(&endpoint, region, "eks", "", credentials.clone(), ca_pem)?;
        Ok(Eks {
            client,
            credentials,
            region: region.to_owned(),
        })
    }

    async fn call(
        &self,
        action: &str,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value, DriverError> {
        self.client
            .rest(action, method, path, &[], body)
            .await
            .map_err(DriverError::from)
    }

    /// `None` where EKS says there is no such thing.
    async fn call_found(
        &self,
        action: &str,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Option<Value>, DriverError> {
        match self.client.rest(action, method, path, &[], body).await {
            Ok(answer) => Ok(Some(answer)),
            Err(e) if e.not_found() => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    async fn node_group_names(&self, cluster: &str) -> Result<Vec<String>, DriverError> {
        let path = format!("/clusters/{}/node-groups", segment(cluster)?);
        let mut names = Vec::new();
        let mut token = String::new();
        loop {
            let mut query = vec![("maxResults", "100")];
            if !token.is_empty() {
                query.push(("nextToken", token.as_str()));
            }
            let page = match self
                .client
                .rest("ListNodegroups", "GET", &path, &query, None)
                .await
            {
                Ok(page) => page,
                Err(e) if e.not_found() => return Ok(Vec::new()),
                Err(e) => return Err(e.into()),
            };
            names.extend(strings(&page["nodegroups"]));
            match page["nextToken"].as_str() {
                Some(next) if !next.is_empty() => token = next.to_owned(),
                _ => return Ok(names),
            }
        }
    }
}

/// The bearer token EKS's API servers take for the identity of `credentials`, as
/// aws-iam-authenticator and `aws eks get-token` make it: `k8s-aws-v1.` and, base64url without
/// padding, an STS `GetCallerIdentity` URL presigned at `at` for 60 s with the cluster's name
/// signed in its `x-k8s-aws-id` header. The cluster's authenticator makes that call to learn
/// who holds the key; the key itself never leaves the hub.
pub fn token(
    credentials: &Credentials,
    region: &str,
    cluster: &str,
    at: time::OffsetDateTime,
) -> String {
    use base64::Engine;
    let url = aws::presigned_get(
        &format!("sts.{region}.amazonaws.com"),
        "/",
        &[("Action", "GetCallerIdentity"), ("Version", "2011-06-15")],
        &[("x-k8s-aws-id", cluster)],
        region,
        "sts",
        credentials,
        at,
        60,
    );
    format!(
        "k8s-aws-v1.{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(url)
    )
}

/// A name as one segment of a path: EKS's names are letters, digits, `-` and `_`, so nothing
/// needs encoding; anything else is refused rather than sent somewhere unintended.
fn segment(name: &str) -> Result<&str, DriverError> {
    let ok = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if ok {
        Ok(name)
    } else {
        Err(DriverError::Refused(format!(
            "{name:?} is not an EKS name (letters, digits, '-' and '_')"
        )))
    }
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

fn tags(value: &Value) -> BTreeMap<String, String> {
    value
        .as_object()
        .map(|tags| {
            tags.iter()
                .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_owned())))
                .collect()
        })
        .unwrap_or_default()
}

fn phase(status: &str) -> Phase {
    match status {
        "ACTIVE" => Phase::Active,
        "CREATING" | "PENDING" => Phase::Creating,
        "UPDATING" => Phase::Updating,
        "DELETING" => Phase::Deleting,
        _ => Phase::Failed,
    }
}

fn count(value: &Value) -> u32 {
    value
        .as_u64()
        .and_then(|n| u32::try_from(n).ok())
        .unwrap_or(0)
}

/// DescribeCluster's `cluster`.
fn cluster_of(cluster: &Value) -> Cluster {
    let text = |key: &str| cluster[key].as_str().unwrap_or_default().to_owned();
    let status = text("status");
    // EKS gives the CA as base64 of its PEM.
    let ca_pem = cluster["certificateAuthority"]["data"]
        .as_str()
        .and_then(|data| {
            use base64::Engine;
            base64::engine::general_purpose::STANDARD.decode(data).ok()
        })
        .and_then(|pem| String::from_utf8(pem).ok())
        .unwrap_or_default();
    Cluster {
        name: text("name"),
        phase: phase(&status),
        status,
        version: text("version"),
        endpoint: text("endpoint"),
        ca_pem,
        tags: tags(&cluster["tags"]),
    }
}

/// DescribeNodegroup's `nodegroup`.
fn node_group_of(group: &Value) -> NodeGroup {
    let text = |key: &str| group[key].as_str().unwrap_or_default().to_owned();
    let status = text("status");
    let scaling = &group["scalingConfig"];
    NodeGroup {
        name: text("nodegroupName"),
        phase: phase(&status),
        status,
        version: text("version"),
        desired_size: count(&scaling["desiredSize"]),
        min_size: count(&scaling["minSize"]),
        max_size: count(&scaling["maxSize"]),
        tags: tags(&group["tags"]),
    }
}

/// `key=value:Effect` as EKS writes a taint.
fn taint(text: &str) -> Result<Value, DriverError> {
    let bad = || {
        DriverError::Refused(format!(
            "taint {text:?}: write it key=value:Effect (NoSchedule, PreferNoSchedule, NoExecute)"
        ))
    };
    let (pair, effect) = text.rsplit_once(':').ok_or_else(bad)?;
    let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
    let effect = match effect {
        "NoSchedule" => "NO_SCHEDULE",
        "PreferNoSchedule" => "PREFER_NO_SCHEDULE",
        "NoExecute" => "NO_EXECUTE",
        _ => return Err(bad()),
    };
    if key.is_empty() {
        return Err(bad());
    }
    Ok(json!({"key": key, "value": value, "effect": effect}))
}

fn scaling(size: Size) -> Value {
    json!({"minSize": size.min, "maxSize": size.max, "desiredSize": size.desired})
}

impl HostedProvider for Eks {
    fn api_token(&self, cluster: &str) -> String {
        token(
            &self.credentials,
            &self.region,
            cluster,
            time::OffsetDateTime::now_utc(),
        )
    }

    fn cluster<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<Cluster>, DriverError>> {
        Box::pin(async move {
            let path = format!("/clusters/{}", segment(name)?);
            let found = self
                .call_found("DescribeCluster", "GET", &path, None)
                .await?;
            Ok(found.map(|answer| cluster_of(&answer["cluster"])))
        })
    }

    fn create_cluster<'a>(
        &'a self,
        request: &'a ClusterRequest,
    ) -> BoxFuture<'a, Result<(), DriverError>> {
        Box::pin(async move {
            segment(&request.name)?;
            let mut body = json!({
                "name": request.name,
                "roleArn": request.role_arn,
                "resourcesVpcConfig": {
                    "subnetIds": request.subnets,
                    "securityGroupIds": request.security_groups,
                    "endpointPublicAccess": request.endpoint_public_access,
                    "endpointPrivateAccess": request.endpoint_private_access,
                },
                "tags": request.tags,
                "clientRequestToken": request.token,
            });
            if !request.version.is_empty() {
                body["version"] = json!(request.version);
            }
            self.call("CreateCluster", "POST", "/clusters", Some(&body))
                .await
                .map(drop)
        })
    }

    fn upgrade_cluster<'a>(
        &'a self,
        name: &'a str,
        version: &'a str,
    ) -> BoxFuture<'a, Result<(), DriverError>> {
        Box::pin(async move {
            let path = format!("/clusters/{}/updates", segment(name)?);
            let body = json!({"version": version});
            self.call("UpdateClusterVersion", "POST", &path, Some(&body))
                .await
                .map(drop)
        })
    }

    fn delete_cluster<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<(), DriverError>> {
        Box::pin(async move {
            let path = format!("/clusters/{}", segment(name)?);
            self.call_found("DeleteCluster", "DELETE", &path, None)
                .await
                .map(drop)
        })
    }

    fn node_groups<'a>(
        &'a self,
        cluster: &'a str,
    ) -> BoxFuture<'a, Result<Vec<NodeGroup>, DriverError>> {
        Box::pin(async move {
            let mut groups = Vec::new();
            for name in self.node_group_names(cluster).await? {
                let path = format!("/clusters/{cluster}/node-groups/{}", segment(&name)?);
                // One deleted between the list and now is simply not there.
                if let Some(answer) = self
                    .call_found("DescribeNodegroup", "GET", &path, None)
                    .await?
                {
                    groups.push(node_group_of(&answer["nodegroup"]));
                }
            }
            Ok(groups)
        })
    }

    fn create_node_group<'a>(
        &'a self,
        request: &'a NodeGroupRequest,
    ) -> BoxFuture<'a, Result<(), DriverError>> {
        Box::pin(async move {
            let path = format!("/clusters/{}/node-groups", segment(&request.cluster)?);
            segment(&request.name)?;
            let taints = request
                .taints
                .iter()
                .map(|t| taint(t))
                .collect::<Result<Vec<_>, _>>()?;
            let mut body = json!({
                "nodegroupName": request.name,
                "scalingConfig": scaling(Size {
                    desired: request.desired_size,
                    min: request.min_size,
                    max: request.max_size,
                }),
                "subnets": request.subnets,
                "nodeRole": request.node_role,
                "labels": request.labels,
                "taints": taints,
                "tags": request.tags,
                "clientRequestToken": request.token,
            });
            if !request.instance_type.is_empty() {
                body["instanceTypes"] = json!([request.instance_type]);
            }
            if request.disk_size > 0 {
                body["diskSize"] = json!(request.disk_size);
            }
            if !request.version.is_empty() {
                body["version"] = json!(request.version);
            }
            self.call("CreateNodegroup", "POST", &path, Some(&body))
                .await
                .map(drop)
        })
    }

    fn scale_node_group<'a>(
        &'a self,
        cluster: &'a str,
        name: &'a str,
        size: Size,
    ) -> BoxFuture<'a, Result<(), DriverError>> {
        Box::pin(async move {
            let path = format!(
                "/clusters/{}/node-groups/{}/update-config",
                segment(cluster)?,
                segment(name)?
            );
            let body = json!({"scalingConfig": scaling(size)});
            self.call("UpdateNodegroupConfig", "POST", &path, Some(&body))
                .await
                .map(drop)
        })
    }

    fn upgrade_node_group<'a>(
        &'a self,
        cluster: &'a str,
        name: &'a str,
        version: &'a str,
    ) -> BoxFuture<'a, Result<(), DriverError>> {
        Box::pin(async move {
            let path = format!(
                "/clusters/{}/node-groups/{}/update-version",
                segment(cluster)?,
                segment(name)?
            );
            let body = json!({"version": version});
            self.call("UpdateNodegroupVersion", "POST", &path, Some(&body))
                .await
                .map(drop)
        })
    }

    fn delete_node_group<'a>(
        &'a self,
        cluster: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<(), DriverError>> {
        Box::pin(async move {
            let path = format!(
                "/clusters/{}/node-groups/{}",
                segment(cluster)?,
                segment(name)?
            );
            self.call_found("DeleteNodegroup", "DELETE", &path, None)
                .await
                .map(drop)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_described_cluster_reads_its_phase_endpoint_and_ca() {
        // The shape of EKS's DescribeCluster answer (its documented fields).
        let answer = json!({"cluster": {
            "name": "shop", "status": "UPDATING", "version": "1.31",
            "endpoint": "https://ABC.gr7.eu-west-1.eks.amazonaws.com",
            "certificateAuthority": {"data": "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg=="},
            "tags": {"drover.io/cluster": "shop"}
        }});
        let cluster = cluster_of(&answer["cluster"]);
        assert_eq!(cluster.phase, Phase::Updating);
        assert_eq!(cluster.status, "UPDATING");
        assert_eq!(cluster.ca_pem, "-----BEGIN CERTIFICATE-----\n");
        assert_eq!(cluster.tags["drover.io/cluster"], "shop");
        assert_eq!(phase("CREATE_FAILED"), Phase::Failed);
        assert_eq!(phase("PENDING"), Phase::Creating);
    }

    #[test]
    fn taints_are_written_as_eks_spells_them() {
        assert_eq!(
            taint("gpu=true:NoSchedule").unwrap(),
            json!({"key": "gpu", "value": "true", "effect": "NO_SCHEDULE"})
        );
        assert_eq!(
            taint("dedicated:NoExecute").unwrap(),
            json!({"key": "dedicated", "value": "", "effect": "NO_EXECUTE"})
        );
        assert!(taint("gpu=true").is_err());
        assert!(taint("gpu=true:Sometimes").is_err());
    }

    #[test]
    fn tokens_carry_a_presigned_sts_call_for_the_cluster() {
        use base64::Engine;
        let credentials = Credentials {
            access_key_id: "AKIDEXAMPLE".into(),
            secret_access_key: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY".into(),
        };
        let at = time::macros::datetime!(2015-08-30 12:36:00 UTC);
        let token = token(&credentials, "us-east-1", "shop", at);
        let encoded = token.strip_prefix("k8s-aws-v1.").unwrap();
        assert!(!encoded.contains(['=', '+', '/']), "{encoded}");
        let url = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(encoded)
            .unwrap();
        // The URL botocore presigns for the same call (see aws.rs).
        assert!(String::from_utf8(url).unwrap().ends_with(
            "X-Amz-SignedHeaders=host%3Bx-k8s-aws-id\
             &X-Amz-Signature=5e7c83cd2380c76be0fafb91d7b5f90b52105f5292882a5b57ea8251a77605b0"
        ));
        assert!(!token.contains(&credentials.secret_access_key));
    }

    #[test]
    fn names_that_would_change_the_path_are_refused() {
        assert!(segment("shop-prod_1").is_ok());
        for bad in ["", "a/b", "..", "a?b", "ä"] {
            assert!(segment(bad).is_err(), "{bad:?}");
        }
    }
}
