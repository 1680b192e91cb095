"""Request bodies of `POST /load_model` and `POST /unload_model`."""
from rest_framework import serializers


class ModelNameSerializer(serializers.Serializer):
    model = serializers.CharField(max_length=300, help_text="a Hugging Face repo id or catalog alias, optionally @revision")

    def validate(self, attrs):
        unknown = set(self.initial_data) - set(self.fields)
        if unknown:
            raise serializers.ValidationError({sorted(unknown)[0]: "Unknown field."})
        return attrs
