//! Order within FIFO message groups. Pure: no I/O.
//!
//! From a standard queue every message of a batch is independent and they run
//! concurrently. From a `.fifo` queue, messages of one message group must run
//! in order, and when one fails, the later ones of its group in the batch
//! fail too without running, so that the group's order is kept when they
//! come back (SQS FIFO semantics). Different groups still run concurrently.

use aws_lambda_events::event::sqs::SqsMessage;

/// The SQS attribute that names a FIFO message's group.
pub const MESSAGE_GROUP_ID: &str = "MessageGroupId";

/// Whether a message came from a FIFO queue.
pub fn is_fifo(message: &SqsMessage) -> bool {
    message
        .event_source_arn
        .as_deref()
        .is_some_and(|arn| arn.ends_with(".fifo"))
}

/// Splits a batch into lanes of message indices: each lane runs in order,
/// lanes run concurrently. A standard-queue message is a lane of its own; the
/// messages of one FIFO group share a lane, in batch order.
pub fn lanes(messages: &[SqsMessage]) -> Vec<Vec<usize>> {
    let mut lanes: Vec<Vec<usize>> = Vec::new();
    let mut group_lane: Vec<(Option<&str>, usize)> = Vec::new();
    for (index, message) in messages.iter().enumerate() {
        if !is_fifo(message) {
            lanes.push(vec![index]);
            continue;
        }
        // A FIFO message without a group id shares the lane of the others
        // without one: keeping too much order is safe, too little is not.
        let group = message.attributes.get(MESSAGE_GROUP_ID).map(String::as_str);
        match group_lane.iter().find(|(g, _)| *g == group) {
            Some((_, lane)) => lanes[*lane].push(index),
            None => {
                group_lane.push((group, lanes.len()));
                lanes.push(vec![index]);
            }
        }
    }
    lanes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(arn: &str, group: Option<&str>) -> SqsMessage {
        let mut m = SqsMessage::default();
        m.event_source_arn = Some(arn.to_string());
        if let Some(group) = group {
            m.attributes.insert(MESSAGE_GROUP_ID.into(), group.into());
        }
        m
    }

    #[test]
    fn standard_messages_each_get_a_lane() {
        let batch = vec![
            message("arn:aws:sqs:r:1:q", None),
            message("arn:aws:sqs:r:1:q", None),
        ];
        assert_eq!(lanes(&batch), vec![vec![0], vec![1]]);
    }

    #[test]
    fn fifo_groups_share_a_lane_in_batch_order() {
        let fifo = "arn:aws:sqs:r:1:q.fifo";
        let batch = vec![
            message(fifo, Some("a")),
            message(fifo, Some("b")),
            message(fifo, Some("a")),
            message(fifo, None),
            message(fifo, Some("b")),
            message(fifo, None),
        ];
        assert!(is_fifo(&batch[0]));
        assert_eq!(lanes(&batch), vec![vec![0, 2], vec![1, 4], vec![3, 5]]);
    }
}
