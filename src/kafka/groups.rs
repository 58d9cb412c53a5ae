//! Consumer groups: the coordinator (FindCoordinator, JoinGroup, SyncGroup, Heartbeat,
//! LeaveGroup, ListGroups, DescribeGroups) and the groups' offsets (OffsetCommit, OffsetFetch).
//!
//! Offsets are the groups' cursors in PostgreSQL (`partition_consumers.committed_offset`,
//! `storage::kafka`): a Kafka group and an HTTP consumer group of the same name share them,
//! and every broker sees them. Membership (who is in a group, its generation, the leader's
//! assignment) is held in the memory of the group's coordinator, as Kafka's coordinator holds
//! it: the client side assignor does the assigning (any protocol, cooperative-sticky included)
//! and the coordinator relays its metadata and the leader's assignment. Which broker
//! coordinates a group is decided in PostgreSQL (`crate::kafka::cluster`): a group request
//! reaching another broker is answered `NOT_COORDINATOR`, and a broker whose hold on a group
//! ran out (or was taken over) drops the group's membership at once.
//!
//! A rebalance completes when every known member has joined again, or when the longest
//! rebalance timeout of the members ran out (members that did not join are dropped); an empty
//! group waits [`INITIAL_DELAY`] for more members first. A member that neither heartbeats
//! nor waits in a join or sync for its session timeout is dropped and the group rebalances.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::describe_groups_response::{DescribedGroup, DescribedGroupMember};
use kafka_protocol::messages::find_coordinator_response::Coordinator as CoordinatorEntry;
use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::leave_group_response::MemberResponse;
use kafka_protocol::messages::list_groups_response::ListedGroup;
use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponseGroup, OffsetFetchResponsePartition, OffsetFetchResponsePartitions,
    OffsetFetchResponseTopic, OffsetFetchResponseTopics,
};
use kafka_protocol::messages::{
    BrokerId, ConsumerProtocolAssignment, DescribeGroupsRequest, DescribeGroupsResponse,
    FindCoordinatorRequest, FindCoordinatorResponse, GroupId, HeartbeatRequest, HeartbeatResponse,
    JoinGroupRequest, JoinGroupResponse, LeaveGroupRequest, LeaveGroupResponse, ListGroupsRequest,
    ListGroupsResponse, OffsetCommitRequest, OffsetCommitResponse, OffsetFetchRequest,
    OffsetFetchResponse, SyncGroupRequest, SyncGroupResponse, TopicName,
};
use kafka_protocol::protocol::{Decodable, StrBytes};
use tokio::sync::oneshot;
use tokio::time::Instant;
use uuid::Uuid;

use crate::kafka::cluster::{coordinate, coordinator_of};
use crate::kafka::metadata::{storage_code, topic_counts};
use crate::kafka::{code, Kafka};
use crate::state::{KafkaGroupMembers, KafkaMember};
use crate::storage::kafka as store;

/// How long an empty group waits for more members before its first generation.
pub const INITIAL_DELAY: Duration = Duration::from_millis(300);
/// How often the coordinator looks for rebalances that ran out and sessions that expired.
pub const TICK: Duration = Duration::from_millis(100);

/// What a member waiting in JoinGroup is answered.
struct Joined {
    error: i16,
    generation: i32,
    protocol: Option<String>,
    leader: String,
    /// Every member with its metadata for the chosen protocol (the leader's answer only).
    members: Vec<(String, Option<String>, Bytes)>,
}

struct Member {
    instance_id: Option<String>,
    protocols: Vec<(String, Bytes)>,
    session_timeout: Duration,
    rebalance_timeout: Duration,
    last_seen: Instant,
    assignment: Bytes,
    join_waiter: Option<oneshot::Sender<Joined>>,
    sync_waiter: Option<oneshot::Sender<(i16, Bytes)>>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Phase {
    Empty,
    Preparing { deadline: Instant },
    Completing,
    Stable,
}

struct Group {
    generation: i32,
    protocol_type: String,
    protocol: Option<String>,
    leader: Option<String>,
    phase: Phase,
    members: BTreeMap<String, Member>,
    joined: HashSet<String>,
}

impl Group {
    fn new() -> Self {
        Self {
            generation: 0,
            protocol_type: String::new(),
            protocol: None,
            leader: None,
            phase: Phase::Empty,
            members: BTreeMap::new(),
            joined: HashSet::new(),
        }
    }

    /// Starts (or keeps) a rebalance, ending at most `after` from now.
    fn prepare(&mut self, after: Duration) {
        if !matches!(self.phase, Phase::Preparing { .. }) {
            self.phase = Phase::Preparing {
                deadline: Instant::now() + after,
            };
            self.joined.clear();
        }
        // Members waiting for an assignment of the old generation must join again.
        for m in self.members.values_mut() {
            if let Some(tx) = m.sync_waiter.take() {
                let _ = tx.send((code::REBALANCE_IN_PROGRESS, Bytes::new()));
            }
        }
    }

    fn longest_rebalance_timeout(&self) -> Duration {
        self.members
            .values()
            .map(|m| m.rebalance_timeout)
            .max()
            .unwrap_or(Duration::from_secs(1))
    }

    /// Ends the rebalance: drops members that did not join, picks the protocol and the
    /// leader, moves to the next generation and answers every waiting join.
    fn complete(&mut self) {
        let joined = std::mem::take(&mut self.joined);
        self.members.retain(|id, _| joined.contains(id));
        if self.members.is_empty() {
            self.phase = Phase::Empty;
            self.leader = None;
            self.protocol = None;
            return;
        }
        if !self
            .leader
            .as_ref()
            .is_some_and(|l| self.members.contains_key(l))
        {
            self.leader = self.members.keys().next().cloned();
        }
        let leader = self
            .leader
            .clone()
            .expect("a group with members has a leader");
        let chosen = self.members[&leader]
            .protocols
            .iter()
            .map(|(name, _)| name.clone())
            .find(|name| {
                self.members
                    .values()
                    .all(|m| m.protocols.iter().any(|(n, _)| n == name))
            });
        self.generation += 1;
        self.protocol = chosen.clone();
        self.phase = Phase::Completing;
        let members: Vec<(String, Option<String>, Bytes)> = self
            .members
            .iter()
            .map(|(id, m)| {
                let metadata = m
                    .protocols
                    .iter()
                    .find(|(n, _)| Some(n) == chosen.as_ref())
                    .map(|(_, md)| md.clone())
                    .unwrap_or_default();
                (id.clone(), m.instance_id.clone(), metadata)
            })
            .collect();
        let error = if chosen.is_some() {
            code::NONE
        } else {
            code::INCONSISTENT_GROUP_PROTOCOL
        };
        for (id, m) in &mut self.members {
            m.assignment = Bytes::new();
            m.last_seen = Instant::now();
            if let Some(tx) = m.join_waiter.take() {
                let _ = tx.send(Joined {
                    error,
                    generation: self.generation,
                    protocol: chosen.clone(),
                    leader: leader.clone(),
                    members: if *id == leader {
                        members.clone()
                    } else {
                        Vec::new()
                    },
                });
            }
        }
    }
}

/// Every group's membership on this broker, and until when this broker holds each group it
/// coordinates (`crate::kafka::cluster`). A group is in memory only while held: the tick drops
/// one whose hold ran out. Locks are taken in the order `groups`, then `holds`.
#[derive(Default)]
pub struct Coordinator {
    groups: Mutex<HashMap<String, Group>>,
    holds: Mutex<HashMap<String, Instant>>,
}

impl Coordinator {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Group>> {
        self.groups.lock().expect("group coordinator lock poisoned")
    }

    fn holds_lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Instant>> {
        self.holds.lock().expect("group holds lock poisoned")
    }

    /// Whether this broker holds `group` now.
    pub fn holds(&self, group: &str) -> bool {
        self.holds_lock()
            .get(group)
            .is_some_and(|until| *until > Instant::now())
    }

    /// Notes that this broker holds `group` until `until`.
    pub fn hold(&self, group: &str, until: Instant) {
        self.holds_lock().insert(group.to_string(), until);
    }

    /// Notes that this broker holds each of `groups` until `until`.
    pub fn hold_all(&self, groups: &[String], until: Instant) {
        let mut holds = self.holds_lock();
        for g in groups {
            holds.insert(g.clone(), until);
        }
    }

    /// The groups with membership in memory (those whose hold is renewed).
    pub fn held(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }

    /// Stops coordinating `names`: forgets the holds and the membership; members waiting in a
    /// join or a sync are answered `NOT_COORDINATOR`, the others hear it at their next request.
    pub fn give_up(&self, names: &[String]) {
        let mut groups = self.lock();
        let mut holds = self.holds_lock();
        for name in names {
            holds.remove(name);
            if let Some(group) = groups.remove(name) {
                Self::dismiss(group);
            }
        }
    }

    /// Stops coordinating every group (a clean stop).
    pub fn give_up_all(&self) {
        let mut groups = self.lock();
        self.holds_lock().clear();
        for (_, group) in groups.drain() {
            Self::dismiss(group);
        }
    }

    /// Answers the members of a group this broker stops coordinating that wait.
    fn dismiss(group: Group) {
        for (_, m) in group.members {
            if let Some(tx) = m.join_waiter {
                let _ = tx.send(Joined {
                    error: code::NOT_COORDINATOR,
                    generation: -1,
                    protocol: None,
                    leader: String::new(),
                    members: Vec::new(),
                });
            }
            if let Some(tx) = m.sync_waiter {
                let _ = tx.send((code::NOT_COORDINATOR, Bytes::new()));
            }
        }
    }

    /// Every group with its members and their assigned partitions, by group id (the views:
    /// `crate::state::KafkaMembership`).
    pub fn snapshot(&self) -> Vec<KafkaGroupMembers> {
        let mut out: Vec<KafkaGroupMembers> = self
            .lock()
            .iter()
            .map(|(id, g)| KafkaGroupMembers {
                group: id.clone(),
                state: state_name(g.phase),
                generation: g.generation,
                protocol: g.protocol.clone(),
                leader: g.leader.clone(),
                members: g
                    .members
                    .iter()
                    .map(|(member_id, m)| KafkaMember {
                        member_id: member_id.clone(),
                        instance_id: m.instance_id.clone(),
                        assigned: assigned_partitions(&m.assignment),
                    })
                    .collect(),
            })
            .collect();
        out.sort_by(|a, b| a.group.cmp(&b.group));
        out
    }

    /// Completes rebalances that ran out and drops members whose session expired; run every
    /// [`TICK`].
    pub fn tick(&self) {
        let now = Instant::now();
        let mut groups = self.lock();
        let ran_out: Vec<String> = {
            let mut holds = self.holds_lock();
            holds.retain(|_, until| *until > now);
            groups
                .keys()
                .filter(|g| !holds.contains_key(*g))
                .cloned()
                .collect()
        };
        for name in ran_out {
            if let Some(group) = groups.remove(&name) {
                tracing::warn!(group = %name,
                    "Kafka group given up: this broker's hold on it ran out unrenewed");
                Self::dismiss(group);
            }
        }
        for (name, group) in groups.iter_mut() {
            let expired: Vec<String> = group
                .members
                .iter()
                .filter(|(_, m)| {
                    m.join_waiter.is_none()
                        && m.sync_waiter.is_none()
                        && m.last_seen + m.session_timeout < now
                })
                .map(|(id, _)| id.clone())
                .collect();
            if !expired.is_empty() {
                for id in &expired {
                    group.members.remove(id);
                    group.joined.remove(id);
                }
                tracing::info!(group = %name, members = ?expired, "Kafka group members' sessions expired");
                if group.members.is_empty() {
                    group.phase = Phase::Empty;
                } else {
                    let after = group.longest_rebalance_timeout();
                    group.prepare(after);
                }
            }
            if let Phase::Preparing { deadline } = group.phase {
                let all_joined = group.members.keys().all(|id| group.joined.contains(id));
                if now >= deadline || (all_joined && !group.members.is_empty()) {
                    group.complete();
                }
            }
        }
        groups.retain(|_, g| g.phase != Phase::Empty || !g.members.is_empty());
    }
}

/// Runs [`Coordinator::tick`] until the runtime stops.
pub async fn tick_loop(kafka: std::sync::Arc<Kafka>) {
    let mut every = tokio::time::interval(TICK);
    loop {
        every.tick().await;
        kafka.groups.tick();
    }
}

fn text(s: &StrBytes) -> String {
    s.to_string()
}

/// FindCoordinator: the broker coordinating each group (`crate::kafka::cluster`: this one when
/// it holds the group or nobody does); transaction coordinators are not served.
pub async fn find_coordinator(
    kafka: &Kafka,
    request: FindCoordinatorRequest,
    version: i16,
) -> FindCoordinatorResponse {
    let keys: Vec<StrBytes> = if version >= 4 {
        request.coordinator_keys
    } else {
        vec![request.key]
    };
    let mut found = Vec::with_capacity(keys.len());
    for key in keys {
        let mut c = CoordinatorEntry::default();
        c.node_id = BrokerId(-1);
        c.port = -1;
        if request.key_type != 0 {
            c.error_code = code::COORDINATOR_NOT_AVAILABLE;
        } else {
            match coordinator_of(kafka, key.as_str()).await {
                Ok(broker) => {
                    c.node_id = BrokerId(broker.node_id);
                    c.host = StrBytes::from_string(broker.host);
                    c.port = broker.port;
                }
                Err(error) => c.error_code = error,
            }
        }
        c.key = key;
        found.push(c);
    }
    let mut response = FindCoordinatorResponse::default();
    if version >= 4 {
        response.coordinators = found;
    } else if let Some(c) = found.pop() {
        response.error_code = c.error_code;
        response.node_id = c.node_id;
        response.host = c.host;
        response.port = c.port;
    }
    response
}

/// JoinGroup: waits until the rebalance completes, then answers the generation (and the
/// leader the members with their metadata).
pub async fn join_group(
    kafka: &Kafka,
    request: JoinGroupRequest,
    _version: i16,
) -> JoinGroupResponse {
    let mut response = JoinGroupResponse::default();
    response.generation_id = -1;
    let group_id = request.group_id.0.to_string();
    if group_id.is_empty() {
        response.error_code = code::INVALID_GROUP_ID;
        return response;
    }
    let session = u64::try_from(request.session_timeout_ms).unwrap_or(0);
    if !(1_000..=3_600_000).contains(&session) {
        response.error_code = code::INVALID_SESSION_TIMEOUT;
        return response;
    }
    let coordinating = coordinate(kafka, &group_id).await;
    if coordinating != code::NONE {
        response.error_code = coordinating;
        return response;
    }
    let session_timeout = Duration::from_millis(session);
    // v0 has no rebalance timeout: the session timeout serves.
    let rebalance_timeout = match u64::try_from(request.rebalance_timeout_ms) {
        Ok(ms) if ms > 0 => Duration::from_millis(ms.min(600_000)),
        _ => session_timeout,
    };
    let protocol_type = text(&request.protocol_type);
    let (member_id, rx) = {
        let mut groups = kafka.groups.lock();
        let group = groups.entry(group_id.clone()).or_insert_with(Group::new);
        if !group.members.is_empty() && group.protocol_type != protocol_type {
            response.error_code = code::INCONSISTENT_GROUP_PROTOCOL;
            return response;
        }
        let mut member_id = text(&request.member_id);
        if member_id.is_empty() {
            member_id = format!("member-{}", Uuid::new_v4());
        } else if !group.members.contains_key(&member_id) {
            response.error_code = code::UNKNOWN_MEMBER_ID;
            response.member_id = request.member_id.clone();
            return response;
        }
        let was_empty = group.members.is_empty();
        group.protocol_type = protocol_type;
        let (tx, rx) = oneshot::channel();
        let member = group
            .members
            .entry(member_id.clone())
            .or_insert_with(|| Member {
                instance_id: None,
                protocols: Vec::new(),
                session_timeout,
                rebalance_timeout,
                last_seen: Instant::now(),
                assignment: Bytes::new(),
                join_waiter: None,
                sync_waiter: None,
            });
        member.instance_id = request.group_instance_id.as_ref().map(text);
        member.protocols = request
            .protocols
            .iter()
            .map(|p| (text(&p.name), p.metadata.clone()))
            .collect();
        member.session_timeout = session_timeout;
        member.rebalance_timeout = rebalance_timeout;
        member.last_seen = Instant::now();
        if let Some(old) = member.join_waiter.replace(tx) {
            let _ = old.send(Joined {
                error: code::UNKNOWN_MEMBER_ID,
                generation: -1,
                protocol: None,
                leader: String::new(),
                members: Vec::new(),
            });
        }
        let after = if was_empty {
            INITIAL_DELAY
        } else {
            group.longest_rebalance_timeout()
        };
        group.prepare(after);
        group.joined.insert(member_id.clone());
        // A rejoin that completes the set ends the rebalance now; otherwise the tick does.
        if !was_empty && group.members.keys().all(|id| group.joined.contains(id)) {
            group.complete();
        }
        (member_id, rx)
    };
    response.member_id = StrBytes::from_string(member_id);
    match tokio::time::timeout(rebalance_timeout + Duration::from_secs(5), rx).await {
        Ok(Ok(joined)) => {
            response.error_code = joined.error;
            response.generation_id = joined.generation;
            response.protocol_type = Some(request.protocol_type);
            response.protocol_name = joined.protocol.map(StrBytes::from_string);
            response.leader = StrBytes::from_string(joined.leader);
            response.members = joined
                .members
                .into_iter()
                .map(|(id, instance, metadata)| {
                    let mut m = JoinGroupResponseMember::default();
                    m.member_id = StrBytes::from_string(id);
                    m.group_instance_id = instance.map(StrBytes::from_string);
                    m.metadata = metadata;
                    m
                })
                .collect();
        }
        _ => response.error_code = code::REBALANCE_IN_PROGRESS,
    }
    response
}

/// SyncGroup: the leader hands in the assignment; every member gets its own part.
pub async fn sync_group(
    kafka: &Kafka,
    request: SyncGroupRequest,
    _version: i16,
) -> SyncGroupResponse {
    let mut response = SyncGroupResponse::default();
    response.protocol_type = request.protocol_type.clone();
    response.protocol_name = request.protocol_name.clone();
    let member_id = text(&request.member_id);
    let coordinating = coordinate(kafka, request.group_id.0.as_str()).await;
    if coordinating != code::NONE {
        response.error_code = coordinating;
        return response;
    }
    let (rx, wait) = {
        let mut groups = kafka.groups.lock();
        let Some(group) = groups.get_mut(request.group_id.0.as_str()) else {
            response.error_code = code::UNKNOWN_MEMBER_ID;
            return response;
        };
        let Some(session) = group.members.get(&member_id).map(|m| m.session_timeout) else {
            response.error_code = code::UNKNOWN_MEMBER_ID;
            return response;
        };
        if request.generation_id != group.generation {
            response.error_code = code::ILLEGAL_GENERATION;
            return response;
        }
        match group.phase {
            Phase::Preparing { .. } | Phase::Empty => {
                response.error_code = code::REBALANCE_IN_PROGRESS;
                return response;
            }
            Phase::Stable => {
                let m = group.members.get_mut(&member_id).expect("checked above");
                m.last_seen = Instant::now();
                response.assignment = m.assignment.clone();
                return response;
            }
            Phase::Completing => {}
        }
        if group.leader.as_deref() == Some(member_id.as_str()) {
            let given: HashMap<String, Bytes> = request
                .assignments
                .into_iter()
                .map(|a| (text(&a.member_id), a.assignment))
                .collect();
            for (id, m) in &mut group.members {
                m.assignment = given.get(id).cloned().unwrap_or_default();
                if let Some(tx) = m.sync_waiter.take() {
                    let _ = tx.send((code::NONE, m.assignment.clone()));
                }
            }
            group.phase = Phase::Stable;
            let m = group.members.get_mut(&member_id).expect("checked above");
            m.last_seen = Instant::now();
            response.assignment = m.assignment.clone();
            return response;
        }
        let (tx, rx) = oneshot::channel();
        let m = group.members.get_mut(&member_id).expect("checked above");
        m.sync_waiter = Some(tx);
        m.last_seen = Instant::now();
        (rx, session)
    };
    match tokio::time::timeout(wait, rx).await {
        Ok(Ok((error, assignment))) => {
            response.error_code = error;
            response.assignment = assignment;
        }
        _ => response.error_code = code::REBALANCE_IN_PROGRESS,
    }
    if let Some(m) = kafka
        .groups
        .lock()
        .get_mut(request.group_id.0.as_str())
        .and_then(|g| g.members.get_mut(&member_id))
    {
        m.last_seen = Instant::now();
    }
    response
}

/// Heartbeat: keeps the member's session; tells it when the group rebalances.
pub async fn heartbeat(
    kafka: &Kafka,
    request: HeartbeatRequest,
    _version: i16,
) -> HeartbeatResponse {
    let mut response = HeartbeatResponse::default();
    let coordinating = coordinate(kafka, request.group_id.0.as_str()).await;
    if coordinating != code::NONE {
        response.error_code = coordinating;
        return response;
    }
    let mut groups = kafka.groups.lock();
    let member_id = text(&request.member_id);
    let Some(group) = groups.get_mut(request.group_id.0.as_str()) else {
        response.error_code = code::UNKNOWN_MEMBER_ID;
        return response;
    };
    let phase = group.phase;
    let generation = group.generation;
    let Some(m) = group.members.get_mut(&member_id) else {
        response.error_code = code::UNKNOWN_MEMBER_ID;
        return response;
    };
    m.last_seen = Instant::now();
    response.error_code = if matches!(phase, Phase::Preparing { .. }) {
        code::REBALANCE_IN_PROGRESS
    } else if request.generation_id != generation {
        code::ILLEGAL_GENERATION
    } else {
        code::NONE
    };
    response
}

/// LeaveGroup: removes the members; the others rebalance.
pub async fn leave_group(
    kafka: &Kafka,
    request: LeaveGroupRequest,
    version: i16,
) -> LeaveGroupResponse {
    let mut response = LeaveGroupResponse::default();
    let ids: Vec<String> = if version >= 3 {
        request.members.iter().map(|m| text(&m.member_id)).collect()
    } else {
        vec![text(&request.member_id)]
    };
    let coordinating = coordinate(kafka, request.group_id.0.as_str()).await;
    if coordinating != code::NONE {
        response.error_code = coordinating;
        return response;
    }
    let mut groups = kafka.groups.lock();
    let Some(group) = groups.get_mut(request.group_id.0.as_str()) else {
        response.error_code = code::UNKNOWN_MEMBER_ID;
        return response;
    };
    let mut any_unknown = false;
    for id in &ids {
        let known = group.members.remove(id).is_some();
        group.joined.remove(id);
        any_unknown |= !known;
        if version >= 3 {
            let mut m = MemberResponse::default();
            m.member_id = StrBytes::from_string(id.clone());
            m.error_code = if known {
                code::NONE
            } else {
                code::UNKNOWN_MEMBER_ID
            };
            response.members.push(m);
        }
    }
    if version < 3 && any_unknown {
        response.error_code = code::UNKNOWN_MEMBER_ID;
    }
    if group.members.is_empty() {
        group.phase = Phase::Empty;
        group.leader = None;
    } else {
        let after = group.longest_rebalance_timeout();
        group.prepare(after);
        if group.members.keys().all(|id| group.joined.contains(id)) {
            group.complete();
        }
    }
    response
}

/// OffsetCommit: sets the group's cursor on each partition. A commit naming a generation goes
/// to the group's coordinator (elsewhere: `NOT_COORDINATOR`), and is checked against the
/// member and generation it knows (a member of an old generation must not move offsets
/// another member now owns). A commit with generation -1 (a consumer assigning partitions
/// itself) is taken by any broker.
pub async fn offset_commit(
    kafka: &Kafka,
    request: OffsetCommitRequest,
    _version: i16,
) -> OffsetCommitResponse {
    let group_id = request.group_id.0.to_string();
    let member_id = text(&request.member_id);
    let coordinating = if request.generation_id_or_member_epoch >= 0 && !group_id.is_empty() {
        coordinate(kafka, &group_id).await
    } else {
        code::NONE
    };
    let membership_error = if coordinating != code::NONE {
        coordinating
    } else {
        let groups = kafka.groups.lock();
        match groups.get(&group_id) {
            Some(group) if request.generation_id_or_member_epoch >= 0 => {
                // As Kafka's coordinator: a member of the current generation may commit while
                // the group prepares a rebalance (it is handing its partitions over), not
                // between the join's answer and its assignment.
                if !group.members.contains_key(&member_id) {
                    code::UNKNOWN_MEMBER_ID
                } else if group.generation != request.generation_id_or_member_epoch {
                    code::ILLEGAL_GENERATION
                } else if group.phase == Phase::Completing {
                    code::REBALANCE_IN_PROGRESS
                } else {
                    code::NONE
                }
            }
            _ => code::NONE,
        }
    };
    let names: Vec<String> = request
        .topics
        .iter()
        .map(|t| t.name.0.to_string())
        .collect();
    let mut response = OffsetCommitResponse::default();
    let mut errors: Vec<Vec<i16>> = request
        .topics
        .iter()
        .map(|t| vec![membership_error; t.partitions.len()])
        .collect();
    if membership_error == code::NONE && !group_id.is_empty() {
        let result = async {
            let counts = topic_counts(kafka, &names, false).await?;
            let (mut queues, mut partitions, mut offsets) = (Vec::new(), Vec::new(), Vec::new());
            for (t, topic) in request.topics.iter().enumerate() {
                for (i, p) in topic.partitions.iter().enumerate() {
                    let known = counts
                        .get(&names[t])
                        .is_some_and(|n| (0..*n).contains(&p.partition_index));
                    if known && p.committed_offset >= 0 {
                        queues.push(names[t].clone());
                        partitions.push(p.partition_index.to_string());
                        offsets.push(p.committed_offset);
                    } else {
                        errors[t][i] = if known {
                            code::OFFSET_OUT_OF_RANGE
                        } else {
                            code::UNKNOWN_TOPIC_OR_PARTITION
                        };
                    }
                }
            }
            if !queues.is_empty() {
                let mut conn = kafka.state.pool.acquire().await?;
                store::commit_offsets(&mut conn, &group_id, &queues, &partitions, &offsets).await?;
            }
            Ok::<_, crate::storage::StorageError>(())
        }
        .await;
        if let Err(e) = result {
            tracing::warn!(group = %group_id, error = %e, "Kafka OffsetCommit failed");
            let code = if e.is_unreachable() {
                code::COORDINATOR_NOT_AVAILABLE
            } else {
                storage_code(&e)
            };
            for row in &mut errors {
                row.iter_mut().for_each(|c| *c = code);
            }
        }
    } else if group_id.is_empty() {
        for row in &mut errors {
            row.iter_mut().for_each(|c| *c = code::INVALID_GROUP_ID);
        }
    }
    for (t, topic) in request.topics.iter().enumerate() {
        let mut entry = OffsetCommitResponseTopic::default();
        entry.name = topic.name.clone();
        entry.partitions = topic
            .partitions
            .iter()
            .zip(&errors[t])
            .map(|(p, e)| {
                let mut r = OffsetCommitResponsePartition::default();
                r.partition_index = p.partition_index;
                r.error_code = *e;
                r
            })
            .collect();
        response.topics.push(entry);
    }
    response
}

/// One group's committed offsets: `(topic, [(partition, offset or -1)])`, for the topics asked
/// (every partition the group has an offset on when `None`).
async fn committed(
    kafka: &Kafka,
    group: &str,
    topics: Option<Vec<(TopicName, Vec<i32>)>>,
) -> Result<Vec<(TopicName, Vec<(i32, i64)>)>, crate::storage::StorageError> {
    let mut conn = kafka.state.pool.acquire().await?;
    match topics {
        None => {
            let mut out: Vec<(TopicName, Vec<(i32, i64)>)> = Vec::new();
            for (queue, partition, offset) in store::group_offsets(&mut conn, group).await? {
                let Ok(index) = partition.parse::<i32>() else {
                    continue;
                };
                if out.last().is_none_or(|(t, _)| t.0.as_str() != queue) {
                    out.push((TopicName(StrBytes::from_string(queue)), Vec::new()));
                }
                out.last_mut().expect("pushed").1.push((index, offset));
            }
            Ok(out)
        }
        Some(topics) => {
            let (mut queues, mut partitions) = (Vec::new(), Vec::new());
            for (name, indexes) in &topics {
                for i in indexes {
                    queues.push(name.0.to_string());
                    partitions.push(i.to_string());
                }
            }
            let mut offsets = store::committed_offsets(&mut conn, group, &queues, &partitions)
                .await?
                .into_iter();
            Ok(topics
                .into_iter()
                .map(|(name, indexes)| {
                    let rows = indexes
                        .into_iter()
                        .map(|i| (i, offsets.next().flatten().unwrap_or(-1)))
                        .collect();
                    (name, rows)
                })
                .collect())
        }
    }
}

/// OffsetFetch: the group's committed offsets (-1 where it has none).
pub async fn offset_fetch(
    kafka: &Kafka,
    request: OffsetFetchRequest,
    version: i16,
) -> OffsetFetchResponse {
    let mut response = OffsetFetchResponse::default();
    if version >= 8 {
        for g in request.groups {
            let topics = g.topics.map(|ts| {
                ts.into_iter()
                    .map(|t| (t.name, t.partition_indexes))
                    .collect()
            });
            let mut entry = OffsetFetchResponseGroup::default();
            entry.group_id = g.group_id.clone();
            match committed(kafka, g.group_id.0.as_str(), topics).await {
                Ok(rows) => {
                    entry.topics = rows
                        .into_iter()
                        .map(|(name, parts)| {
                            let mut t = OffsetFetchResponseTopics::default();
                            t.name = name;
                            t.partitions = parts
                                .into_iter()
                                .map(|(i, offset)| {
                                    let mut p = OffsetFetchResponsePartitions::default();
                                    p.partition_index = i;
                                    p.committed_offset = offset;
                                    p.committed_leader_epoch = -1;
                                    p.metadata = Some(StrBytes::new());
                                    p
                                })
                                .collect();
                            t
                        })
                        .collect();
                }
                Err(e) => {
                    tracing::warn!(group = %g.group_id.0.as_str(), error = %e, "Kafka OffsetFetch failed");
                    entry.error_code = code::COORDINATOR_NOT_AVAILABLE;
                }
            }
            response.groups.push(entry);
        }
        return response;
    }
    let GroupId(group) = request.group_id;
    let topics = request.topics.map(|ts| {
        ts.into_iter()
            .map(|t| (t.name, t.partition_indexes))
            .collect()
    });
    match committed(kafka, group.as_str(), topics).await {
        Ok(rows) => {
            response.topics = rows
                .into_iter()
                .map(|(name, parts)| {
                    let mut t = OffsetFetchResponseTopic::default();
                    t.name = name;
                    t.partitions = parts
                        .into_iter()
                        .map(|(i, offset)| {
                            let mut p = OffsetFetchResponsePartition::default();
                            p.partition_index = i;
                            p.committed_offset = offset;
                            p.committed_leader_epoch = -1;
                            p.metadata = Some(StrBytes::new());
                            p
                        })
                        .collect();
                    t
                })
                .collect();
        }
        Err(e) => {
            tracing::warn!(group = %group.as_str(), error = %e, "Kafka OffsetFetch failed");
            response.error_code = code::COORDINATOR_NOT_AVAILABLE;
        }
    }
    response
}

/// Kafka's name of a group state.
/// The topics and partitions of a consumer-protocol assignment (version, then the assignment);
/// empty when it is something else.
fn assigned_partitions(assignment: &Bytes) -> Vec<(String, Vec<i32>)> {
    let mut buf = assignment.clone();
    if buf.len() < 2 {
        return Vec::new();
    }
    let version = i16::from_be_bytes([buf[0], buf[1]]);
    let _ = buf.split_to(2);
    if !(0..=3).contains(&version) {
        return Vec::new();
    }
    ConsumerProtocolAssignment::decode(&mut buf, version)
        .map(|a| {
            a.assigned_partitions
                .into_iter()
                .map(|t| (t.topic.0.to_string(), t.partitions))
                .collect()
        })
        .unwrap_or_default()
}

fn state_name(phase: Phase) -> &'static str {
    match phase {
        Phase::Empty => "Empty",
        Phase::Preparing { .. } => "PreparingRebalance",
        Phase::Completing => "CompletingRebalance",
        Phase::Stable => "Stable",
    }
}

/// ListGroups: the groups this broker coordinates (clients ask every broker of the cluster and
/// merge the lists, as with Kafka).
pub async fn list_groups(
    kafka: &Kafka,
    request: ListGroupsRequest,
    _version: i16,
) -> ListGroupsResponse {
    let mut response = ListGroupsResponse::default();
    let wanted: Vec<String> = request.states_filter.iter().map(text).collect();
    let groups = kafka.groups.lock();
    let mut listed: Vec<ListedGroup> = groups
        .iter()
        .filter(|(_, g)| {
            wanted.is_empty()
                || wanted
                    .iter()
                    .any(|w| w.eq_ignore_ascii_case(state_name(g.phase)))
        })
        .map(|(id, g)| {
            let mut l = ListedGroup::default();
            l.group_id = GroupId(StrBytes::from_string(id.clone()));
            l.protocol_type = StrBytes::from_string(g.protocol_type.clone());
            l.group_state = StrBytes::from_static_str(state_name(g.phase));
            l.group_type = StrBytes::from_static_str("classic");
            l
        })
        .collect();
    listed.sort_by(|a, b| a.group_id.0.as_str().cmp(b.group_id.0.as_str()));
    response.groups = listed;
    response
}

/// DescribeGroups: state, protocol and members (with their metadata and assignment) of each
/// group this broker coordinates; a group without members here is `Dead`, as Kafka describes
/// an unknown one, and a group another broker coordinates is `NOT_COORDINATOR`.
pub async fn describe_groups(
    kafka: &Kafka,
    request: DescribeGroupsRequest,
    _version: i16,
) -> DescribeGroupsResponse {
    let mut response = DescribeGroupsResponse::default();
    let mut coordinating = Vec::with_capacity(request.groups.len());
    for id in &request.groups {
        coordinating.push(coordinate(kafka, id.0.as_str()).await);
    }
    let groups = kafka.groups.lock();
    for (id, error) in request.groups.into_iter().zip(coordinating) {
        let mut d = DescribedGroup::default();
        d.authorized_operations = i32::MIN;
        d.error_code = error;
        match groups.get(id.0.as_str()) {
            _ if error != code::NONE => {}
            None => d.group_state = StrBytes::from_static_str("Dead"),
            Some(g) => {
                d.group_state = StrBytes::from_static_str(state_name(g.phase));
                d.protocol_type = StrBytes::from_string(g.protocol_type.clone());
                d.protocol_data = StrBytes::from_string(g.protocol.clone().unwrap_or_default());
                d.members = g
                    .members
                    .iter()
                    .map(|(member_id, m)| {
                        let mut dm = DescribedGroupMember::default();
                        dm.member_id = StrBytes::from_string(member_id.clone());
                        dm.group_instance_id = m.instance_id.clone().map(StrBytes::from_string);
                        dm.member_metadata = m
                            .protocols
                            .iter()
                            .find(|(n, _)| Some(n) == g.protocol.as_ref())
                            .map(|(_, md)| md.clone())
                            .unwrap_or_default();
                        dm.member_assignment = m.assignment.clone();
                        dm
                    })
                    .collect();
            }
        }
        d.group_id = id;
        response.groups.push(d);
    }
    response
}
