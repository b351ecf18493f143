"""The Batch API's errors, as the API's own error classes (OpenAI's shape)."""

from inference.errors import InvalidRequest, NotFound, RequestTooLarge


class FileNotFound(NotFound):
    def __init__(self, file_id: str):
        super().__init__(f"No such File object: {file_id}", param="file_id")


class BatchNotFound(NotFound):
    def __init__(self, batch_id: str):
        super().__init__(f"No batch found with id '{batch_id}'.", param="batch_id")


class FileTooLarge(RequestTooLarge):
    def __init__(self, size: int, limit: int):
        super().__init__(
            f"The file is {size} bytes; your tier's limit for batch files is {limit} bytes.",
            param="file",
            code="file_too_large",
        )


class InvalidBatchRequest(InvalidRequest):
    """A 400 about a file or batch (purpose, endpoint, window, input file)."""
