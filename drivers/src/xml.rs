//! Just enough XML for the answers of AWS's Query API: elements, their text and children (no
//! attributes, namespaces, DTDs or CDATA, which those answers do not use), entities decoded.

/// An element: its local name, its text (children's text excluded) and its children.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Element {
    pub name: String,
    pub text: String,
    pub children: Vec<Element>,
}

impl Element {
    /// The first child named `name`.
    pub fn find(&self, name: &str) -> Option<&Element> {
        self.children.iter().find(|c| c.name == name)
    }

    /// The children named `name`.
    pub fn all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Element> + 'a {
        self.children.iter().filter(move |c| c.name == name)
    }

    /// The text of the first child named `name`, or "".
    pub fn text_of(&self, name: &str) -> &str {
        self.find(name).map_or("", |c| c.text.as_str())
    }

    /// The first element named `name` anywhere below (depth first).
    pub fn descendant(&self, name: &str) -> Option<&Element> {
        self.children.iter().find_map(|c| {
            if c.name == name {
                Some(c)
            } else {
                c.descendant(name)
            }
        })
    }
}

/// Parses a document into its root element.
pub fn parse(text: &str) -> Result<Element, String> {
    let mut stack: Vec<Element> = vec![Element::default()];
    let mut rest = text;
    while !rest.is_empty() {
        let Some(open) = rest.find('<') else {
            push_text(&mut stack, rest)?;
            break;
        };
        push_text(&mut stack, &rest[..open])?;
        rest = &rest[open..];
        if let Some(after) = rest.strip_prefix("<?") {
            rest = skip_past(after, "?>")?;
        } else if let Some(after) = rest.strip_prefix("<!--") {
            rest = skip_past(after, "-->")?;
        } else if let Some(after) = rest.strip_prefix("</") {
            let end = after.find('>').ok_or("an unclosed end tag")?;
            let name = local(after[..end].trim());
            let element = stack.pop().ok_or("an end tag without a start")?;
            if element.name != name || stack.is_empty() {
                return Err(format!("</{name}> does not close <{}>", element.name));
            }
            stack.last_mut().ok_or("unbalanced")?.children.push(element);
            rest = &after[end + 1..];
        } else {
            let after = &rest[1..];
            let end = after.find('>').ok_or("an unclosed start tag")?;
            let tag = &after[..end];
            let (tag, closed) = match tag.strip_suffix('/') {
                Some(t) => (t, true),
                None => (tag, false),
            };
            let name = local(tag.split_whitespace().next().ok_or("an empty tag")?);
            let element = Element {
                name: name.to_owned(),
                ..Element::default()
            };
            if closed {
                stack.last_mut().ok_or("unbalanced")?.children.push(element);
            } else {
                stack.push(element);
            }
            rest = &after[end + 1..];
        }
    }
    let mut document = stack.pop().ok_or("empty")?;
    if !stack.is_empty() {
        return Err(format!("<{}> is not closed", document.name));
    }
    match document.children.len() {
        1 => Ok(document.children.remove(0)),
        n => Err(format!("{n} root elements")),
    }
}

fn skip_past<'a>(text: &'a str, end: &str) -> Result<&'a str, String> {
    text.find(end)
        .map(|i| &text[i + end.len()..])
        .ok_or_else(|| format!("no closing {end}"))
}

/// The name without its namespace prefix.
fn local(name: &str) -> &str {
    name.rsplit(':').next().unwrap_or(name)
}

fn push_text(stack: &mut [Element], raw: &str) -> Result<(), String> {
    if raw.trim().is_empty() {
        return Ok(());
    }
    let top = stack.last_mut().ok_or("unbalanced")?;
    let mut rest = raw;
    while let Some(amp) = rest.find('&') {
        top.text.push_str(&rest[..amp]);
        let semi = rest[amp..].find(';').ok_or("an unterminated entity")? + amp;
        let entity = &rest[amp + 1..semi];
        let decoded = match entity {
            "amp" => '&',
            "lt" => '<',
            "gt" => '>',
            "quot" => '"',
            "apos" => '\'',
            _ => {
                let code = if let Some(hex) = entity.strip_prefix("#x") {
                    u32::from_str_radix(hex, 16).ok()
                } else {
                    entity.strip_prefix('#').and_then(|d| d.parse().ok())
                };
                code.and_then(char::from_u32)
                    .ok_or_else(|| format!("an unknown entity &{entity};"))?
            }
        };
        top.text.push(decoded);
        rest = &rest[semi + 1..];
    }
    top.text.push_str(rest);
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn reads_an_ec2_answer() {
        let root = parse(
            r#"<?xml version="1.0" encoding="UTF-8"?>
<DescribeInstancesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">
  <requestId>r-1</requestId>
  <reservationSet><item><instancesSet>
    <item><instanceId>i-1</instanceId><instanceState><code>16</code><name>running</name></instanceState>
      <tagSet><item><key>a&amp;b</key><value>&lt;x&#62;&#x41;</value></item></tagSet><empty/></item>
  </instancesSet></item></reservationSet>
</DescribeInstancesResponse>"#,
        )
        .unwrap();
        assert_eq!(root.name, "DescribeInstancesResponse");
        let instance = root
            .descendant("instancesSet")
            .unwrap()
            .find("item")
            .unwrap();
        assert_eq!(instance.text_of("instanceId"), "i-1");
        assert_eq!(
            instance.find("instanceState").unwrap().text_of("name"),
            "running"
        );
        let tag = instance.descendant("tagSet").unwrap().find("item").unwrap();
        assert_eq!((tag.text_of("key"), tag.text_of("value")), ("a&b", "<x>A"));
        assert!(instance.find("empty").is_some());
    }

    #[test]
    fn refuses_what_is_not_one_balanced_document() {
        assert!(parse("<a><b></a>").is_err());
        assert!(parse("<a>").is_err());
        assert!(parse("<a/><b/>").is_err());
        assert!(parse("<a>&bogus;</a>").is_err());
        assert!(parse("").is_err());
    }
}
