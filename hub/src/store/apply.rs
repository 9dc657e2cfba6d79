//! What a transaction does to the objects it names, whatever keeps them: identity, generation,
//! resourceVersion checks and finalizers are decided here once, and each backend only reads the
//! objects a transaction touches and writes what this says they became.

use std::collections::BTreeMap;

use ring::rand::{SecureRandom, SystemRandom};

use super::{EventType, Object, Op, StoreError, WatchEvent};

/// An object's key: its kind and name.
pub(super) type Key = (String, String);

/// The outcome of a transaction's ops, before the backend commits it.
#[derive(Debug, Default)]
pub(super) struct Applied {
    /// Each op's object as written (a deleted one as it was), in op order.
    pub(super) written: Vec<Object>,
    /// One change per op, in op order.
    pub(super) events: Vec<WatchEvent>,
    /// Every object the ops read, as it was before them (`None`: absent).
    pub(super) before: BTreeMap<Key, Option<Object>>,
    /// Every object the ops wrote, as it is after them (`None`: gone). An object read but
    /// left as it was (an [`Op::Modify`] that changed nothing) is not here.
    pub(super) after: BTreeMap<Key, Option<Object>>,
}

/// The key of each object `ops` name, in op order, without repeats.
pub(super) fn keys(ops: &[Op]) -> Vec<Key> {
    let mut keys: Vec<Key> = Vec::with_capacity(ops.len());
    for op in ops {
        let (kind, name) = op.key();
        if !keys.iter().any(|(k, n)| k == kind && n == name) {
            keys.push((kind.to_owned(), name.to_owned()));
        }
    }
    keys
}

/// Applies `ops` in order to the objects `load` reads (each read once; later ops see earlier
/// ones' results). `revision` is the resourceVersion the writes get, if the backend knows it
/// before committing; otherwise it stays empty and the backend sets it afterwards.
pub(super) fn apply(
    ops: Vec<Op>,
    revision: Option<u64>,
    now: &str,
    mut load: impl FnMut(&str, &str) -> Result<Option<Object>, StoreError>,
) -> Result<Applied, StoreError> {
    let rv = revision.map(|r| r.to_string()).unwrap_or_default();
    let mut applied = Applied::default();
    // The object as the ops so far left it: written by an earlier op, or read (once).
    let mut current = |applied: &mut Applied, kind: &str, name: &str| {
        let key = (kind.to_owned(), name.to_owned());
        if let Some(object) = applied.after.get(&key).or_else(|| applied.before.get(&key)) {
            return Ok(object.clone());
        }
        let object = load(kind, name)?;
        applied.before.insert(key, object.clone());
        Ok::<_, StoreError>(object)
    };
    for op in ops {
        let (event, object, kept) = match op {
            Op::Create(mut object) => {
                check_name(&object)?;
                if current(&mut applied, &object.kind, &object.metadata.name)?.is_some() {
                    return Err(StoreError::AlreadyExists {
                        kind: object.kind,
                        name: object.metadata.name,
                    });
                }
                let m = &mut object.metadata;
                // A uid chosen before the transaction (`refs::stamp_all`) is kept: objects
                // created beside this one may already name it.
                if m.uid.is_empty() {
                    m.uid = new_uid();
                }
                m.resource_version = rv.clone();
                m.generation = 1;
                m.creation_timestamp = now.to_owned();
                m.deletion_timestamp = None;
                (EventType::Added, object, true)
            }
            Op::Update(object) => {
                check_name(&object)?;
                let Some(stored) = current(&mut applied, &object.kind, &object.metadata.name)?
                else {
                    return Err(StoreError::NotFound {
                        kind: object.kind,
                        name: object.metadata.name,
                    });
                };
                let sent = &object.metadata.resource_version;
                if !sent.is_empty() && *sent != stored.metadata.resource_version {
                    return Err(StoreError::Conflict {
                        kind: object.kind,
                        name: object.metadata.name,
                        sent: sent.clone(),
                        current: stored.metadata.resource_version,
                    });
                }
                update(&stored, object, &rv)
            }
            Op::Modify { kind, name, change } => {
                let Some(stored) = current(&mut applied, &kind, &name)? else {
                    return Err(StoreError::NotFound { kind, name });
                };
                let mut object = stored.clone();
                (change.0)(&mut object);
                if object == stored {
                    // Nothing to write: the op's object is the stored one, unchanged.
                    applied.written.push(stored);
                    continue;
                }
                object.kind = kind;
                object.metadata.name = name;
                update(&stored, object, &rv)
            }
            Op::Delete {
                kind,
                name,
                resource_version,
            } => {
                let Some(mut object) = current(&mut applied, &kind, &name)? else {
                    return Err(StoreError::NotFound { kind, name });
                };
                if let Some(expected) = resource_version
                    && expected != object.revision()
                {
                    return Err(StoreError::Conflict {
                        kind,
                        name,
                        sent: expected.to_string(),
                        current: object.metadata.resource_version,
                    });
                }
                object.metadata.resource_version = rv.clone();
                if object.metadata.finalizers.is_empty() {
                    (EventType::Deleted, object, false)
                } else {
                    object
                        .metadata
                        .deletion_timestamp
                        .get_or_insert_with(|| now.to_owned());
                    (EventType::Modified, object, true)
                }
            }
        };
        let key = (object.kind.clone(), object.metadata.name.clone());
        applied.after.insert(key, kept.then(|| object.clone()));
        applied.events.push(WatchEvent {
            kind: event,
            object: object.clone(),
        });
        applied.written.push(object);
    }
    Ok(applied)
}

/// `object` written over `stored`: identity and history stay the store's, whatever the caller
/// sent; (the change it makes, the object as written, whether it is still stored after).
fn update(stored: &Object, mut object: Object, rv: &str) -> (EventType, Object, bool) {
    let spec_changed = object.spec != stored.spec;
    let m = &mut object.metadata;
    m.uid = stored.metadata.uid.clone();
    m.creation_timestamp = stored.metadata.creation_timestamp.clone();
    m.deletion_timestamp = stored.metadata.deletion_timestamp.clone();
    // What an object was created for never changes; an object stored before references
    // existed gets them once (`refs::backfill`).
    if !stored.metadata.owner_references.is_empty() {
        m.owner_references = stored.metadata.owner_references.clone();
    }
    m.generation = stored.metadata.generation + u64::from(spec_changed);
    m.resource_version = rv.to_owned();
    if m.deletion_timestamp.is_some() && m.finalizers.is_empty() {
        // The last finalizer is gone: the deletion asked for earlier happens now.
        (EventType::Deleted, object, false)
    } else {
        (EventType::Modified, object, true)
    }
}

pub fn new_uid() -> String {
    let mut b = [0u8; 16];
    let _ = SystemRandom::new().fill(&mut b);
    b[6] = (b[6] & 0x0f) | 0x40; // version 4
    b[8] = (b[8] & 0x3f) | 0x80; // RFC 4122 variant
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

fn check_name(object: &Object) -> Result<(), StoreError> {
    let name = &object.metadata.name;
    // A kind is a word of the hub's own; '/' would let one kind's keys reach into another's.
    if object.kind.is_empty() || object.kind.contains('/') {
        return Err(StoreError::Invalid(format!(
            "an object needs a kind without '/' (got {:?})",
            object.kind
        )));
    }
    if name.is_empty() || name.len() > 253 || name.contains('/') {
        return Err(StoreError::Invalid(format!(
            "{} name {name:?} is not valid: 1 to 253 characters, no '/'",
            object.kind
        )));
    }
    Ok(())
}
