"""moto's server, with one mend to its signature check.

moto 5.2.5 checks a request's Signature Version 4 against a payload of the request's body,
or, when the body is empty, of what it parsed from the request: for its REST services (EKS)
that is the request's headers, so every signed GET and DELETE of EKS is refused as
"SignatureDoesNotMatch", boto3's too. A GET, HEAD or DELETE without a body is checked against
the empty payload, as AWS checks it; nothing else changes (a form POST's body is what moto
parsed, and stays).
"""

import sys

from moto.iam import access_control
from moto.server import main

_create_aws_request = access_control.IAMRequestBase._create_aws_request


def _with_the_body_signed(self):
    request = _create_aws_request(self)
    if self._method in ("GET", "HEAD", "DELETE") and not self._body:
        request.data = b""
    return request


access_control.IAMRequestBase._create_aws_request = _with_the_body_signed

if __name__ == "__main__":
    sys.exit(main())
