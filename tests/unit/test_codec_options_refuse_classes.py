"""``Options(value_deserializer=StringDeserializer)`` (the class, parentheses forgotten) is a
configuration error at once: accepted, every record would fail to deserialize (the class
cannot be called with ``(data, SerializationContext)``) and go to the dead-letter topic."""

from __future__ import annotations

import pytest
from confluent_kafka.serialization import StringDeserializer, StringSerializer

from parallel_consumer import ConfigurationError, Options


@pytest.mark.parametrize(
    ("option", "codec"),
    [
        ("key_deserializer", StringDeserializer),
        ("value_deserializer", StringDeserializer),
        ("key_serializer", StringSerializer),
        ("value_serializer", StringSerializer),
    ],
)
def test_a_serializer_class_instead_of_an_instance_is_a_configuration_error(
    option: str, codec: type
) -> None:
    with pytest.raises(ConfigurationError, match=option):
        Options(**{option: codec})
