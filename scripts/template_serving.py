"""How template.yaml serves the outputs to players, checked.

Read with cfn-lint's own template decoder, the template:
- has a `CorsAllowedOrigins` parameter, empty by default, and puts the
  output bucket's CORS rule under a condition on it;
- creates, only when `CloudFrontDistribution` is "true", a distribution
  whose one origin is the output bucket reached through origin access
  control, and a bucket policy that lets only that distribution
  (`AWS:SourceArn`) read only the output prefix.

Then on the emulators' S3 (LocalStack), the bucket's CORS rule as the
template writes it, with one origin configured: a GET from that origin, a
ranged one too, is answered with `Access-Control-Allow-Origin`, a
preflight for `Range` is allowed, and another origin gets no grant.

Run by `make test`: python scripts/template_serving.py (the emulators'
environment: AWS_ENDPOINT_URL).
"""

import os
import sys
import urllib.request
import uuid

import boto3
from cfnlint.decode import decode

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fail(message):
    print(f"template_serving: {message}", file=sys.stderr)
    sys.exit(1)


def check(condition, message):
    if not condition:
        fail(message)


def template():
    parsed, problems = decode(os.path.join(ROOT, "template.yaml"))
    check(not problems, f"template.yaml does not parse: {problems}")
    return parsed


def check_template(t):
    params, resources = t["Parameters"], t["Resources"]
    origins = params.get("CorsAllowedOrigins")
    check(origins is not None, "no CorsAllowedOrigins parameter")
    check(origins["Type"] == "CommaDelimitedList", "CorsAllowedOrigins is not a list")
    check(origins.get("Default") == "", "CORS must allow no origin by default")
    check(params["CloudFrontDistribution"]["Default"] == "false", "a distribution by default")

    cors = resources["OutputBucket"]["Properties"]["CorsConfiguration"]
    condition, rules, otherwise = cors["Fn::If"]
    check(condition == "AllowsCors", f"CORS under {condition}")
    check(otherwise == {"Ref": "AWS::NoValue"}, "CORS without origins is not absent")
    rule = rules["CorsRules"][0]
    check(rule["AllowedOrigins"] == {"Ref": "CorsAllowedOrigins"}, "CORS origins not the parameter")
    check(sorted(rule["AllowedMethods"]) == ["GET", "HEAD"], "CORS allows more than reads")
    # tests/player.rs plays a package in Chromium through this rule, as written here.
    check(rule["AllowedHeaders"] == ["Range"], "CORS headers are not Range alone")
    check(rule["ExposedHeaders"] == ["Content-Length", "Content-Range", "ETag"],
          "CORS exposes other headers than tests/player.rs plays with")
    check(rule["MaxAge"] == 86400, "CORS preflights are cached another time")

    for name in ["OutputDistribution", "OutputOriginAccessControl", "OutputBucketPolicy"]:
        check(resources[name].get("Condition") == "CreatesDistribution", f"{name} is not optional")
    distribution = resources["OutputDistribution"]["Properties"]["DistributionConfig"]
    (origin,) = distribution["Origins"]
    check(origin["DomainName"] == {"Fn::GetAtt": ["OutputBucket", "RegionalDomainName"]},
          "the distribution's origin is not the output bucket")
    check(origin["OriginAccessControlId"] == {"Fn::GetAtt": ["OutputOriginAccessControl", "Id"]},
          "the origin is not read through origin access control")
    oac = resources["OutputOriginAccessControl"]["Properties"]["OriginAccessControlConfig"]
    check(oac["SigningBehavior"] == "always" and oac["OriginAccessControlOriginType"] == "s3",
          "origin access control does not sign every request")
    check(distribution["DefaultCacheBehavior"]["ViewerProtocolPolicy"] == "redirect-to-https",
          "the distribution serves plain HTTP")
    (statement,) = resources["OutputBucketPolicy"]["Properties"]["PolicyDocument"]["Statement"]
    check(statement["Principal"] == {"Service": "cloudfront.amazonaws.com"}, "policy principal")
    check(statement["Action"] == "s3:GetObject", "the distribution may do more than read")
    check(statement["Resource"] == {"Fn::Sub": "${OutputBucket.Arn}/${OutputPrefix}*"},
          "the distribution reads more than the output prefix")
    source = statement["Condition"]["StringEquals"]["AWS:SourceArn"]["Fn::Sub"]
    check(source.endswith(":distribution/${OutputDistribution}"),
          "any distribution could read the bucket")
    return rule


def request(url, method="GET", headers=None):
    req = urllib.request.Request(url, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req) as response:
            return response.status, dict(response.headers)
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers)


def check_on_s3(rule):
    endpoint = os.environ.get("AWS_ENDPOINT_URL")
    check(endpoint, "AWS_ENDPOINT_URL is not set: start the emulators")
    s3 = boto3.client("s3", endpoint_url=endpoint)
    bucket = f"serving-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    app = "https://app.example.com"
    # The template's rule with the parameter given one origin, in the
    # API's names for CloudFormation's (ExposedHeaders, MaxAge).
    renamed = {"ExposedHeaders": "ExposeHeaders", "MaxAge": "MaxAgeSeconds"}
    configured = {renamed.get(k, k): v for k, v in rule.items()}
    configured["AllowedOrigins"] = [app]
    s3.put_bucket_cors(Bucket=bucket, CORSConfiguration={"CORSRules": [configured]})
    key = "derived/k/master.m3u8"
    s3.put_object(Bucket=bucket, Key=key, Body=b"#EXTM3U\n",
                  ContentType="application/vnd.apple.mpegurl",
                  CacheControl="public, max-age=31536000, immutable")
    url = f"{endpoint}/{bucket}/{key}"

    status, headers = request(url, headers={"Origin": app})
    check(status == 200, f"GET from {app}: {status}")
    check(headers.get("Access-Control-Allow-Origin") in (app, "*"),
          f"GET from {app} is not granted: {headers}")
    check(headers.get("Cache-Control") == "public, max-age=31536000, immutable",
          f"Cache-Control not served: {headers}")
    status, headers = request(url, headers={"Origin": app, "Range": "bytes=0-3"})
    check(status == 206 and headers.get("Access-Control-Allow-Origin") in (app, "*"),
          f"a ranged GET from {app}: {status} {headers}")
    status, headers = request(url, method="OPTIONS", headers={
        "Origin": app, "Access-Control-Request-Method": "GET",
        "Access-Control-Request-Headers": "range"})
    check(status == 200, f"a preflight for Range from {app}: {status} {headers}")
    status, headers = request(url, headers={"Origin": "https://elsewhere.example"})
    check("Access-Control-Allow-Origin" not in headers,
          f"another origin is granted: {headers}")

    s3.delete_object(Bucket=bucket, Key=key)
    s3.delete_bucket(Bucket=bucket)


def main():
    rule = check_template(template())
    check_on_s3(rule)
    print("template_serving: the template's CORS rule and optional distribution check out")


if __name__ == "__main__":
    main()
